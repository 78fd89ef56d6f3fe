"""Vision methods: E2I-VRWKV light-field segmentation (`algorithms.vision.e2i_vrwkv`) and PLMD label-map
diffusion for map completion (`algorithms.vision.plmd`) with its goal-search navigation agent
(`algorithms.vision.plmd_nav`)."""

from algorithms.vision import plmd, plmd_nav
from algorithms.vision.e2i_vrwkv import E2IConfig, E2IVRWKV, epi_structure_tensor, mean_iou

__all__ = ["E2IConfig", "E2IVRWKV", "epi_structure_tensor", "mean_iou", "plmd", "plmd_nav"]
