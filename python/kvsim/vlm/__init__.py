"""An assembled vision-language model from real trained parts, for end-to-end multimodal
experiments where no pretrained VLM can be had: Google's ImageNet MobileNetV2 as the vision
encoder, a projector trained here, and Karpathy's stories260K as the language model (LLaVA's
stage-1 recipe), on Fashion-MNIST images. A toy: a tiny decoder and one task.

    python -m kvsim.vlm build --models DIR        # or kvsim.vlm.build(DIR)
    python -m kvsim.vlm build-multi --models DIR  # eight images, a question about one

Needs torch, PIL and Debian's dataset-fashion-mnist (install-deps.sh installs them).
"""
from kvsim.vlm.assemble import DEFAULTS, SMALL, build, cache_root
from kvsim.vlm.multi import MULTI_DEFAULTS, MULTI_SMALL, build_multi

__all__ = ["build", "DEFAULTS", "SMALL", "cache_root", "build_multi", "MULTI_DEFAULTS",
           "MULTI_SMALL"]
