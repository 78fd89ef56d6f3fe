"""Vision methods: E2I-VRWKV light-field segmentation (`algorithms.vision.e2i_vrwkv`) and PLMD label-map
diffusion for map completion (`algorithms.vision.plmd`; its goal-search navigation agent acts in the
floorplan task, `experiments.tasks.floorplan_nav`)."""

from algorithms.vision import plmd
from algorithms.vision.e2i_vrwkv import E2IConfig, E2IVRWKV, epi_structure_tensor, mean_iou

__all__ = ["E2IConfig", "E2IVRWKV", "epi_structure_tensor", "mean_iou", "plmd"]
