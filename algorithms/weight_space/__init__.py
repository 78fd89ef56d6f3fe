"""Weight-space learning: a digits model zoo (`algorithms.weight_space.zoo`) and the multi-view probe
MVProbe with its ProbeX and weight-statistics baselines (`algorithms.weight_space.mvprobe`), and WeightCLIP, a
weight autoencoder aligned with a dataset encoder (`algorithms.weight_space.weightclip`)."""

from algorithms.weight_space import mvprobe, weightclip, zoo
from algorithms.weight_space.zoo import Zoo, ZooConfig, ZooMLP, build_zoo

__all__ = ["mvprobe", "weightclip", "zoo", "Zoo", "ZooConfig", "ZooMLP", "build_zoo"]
