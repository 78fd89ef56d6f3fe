"""Weight-space learning: a digits model zoo (`algorithms.weight_space.zoo`) and the multi-view probe
MVProbe with its ProbeX and weight-statistics baselines (`algorithms.weight_space.mvprobe`)."""

from algorithms.weight_space import mvprobe, zoo
from algorithms.weight_space.zoo import Zoo, ZooConfig, ZooMLP, build_zoo

__all__ = ["mvprobe", "zoo", "Zoo", "ZooConfig", "ZooMLP", "build_zoo"]
