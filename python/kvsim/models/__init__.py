"""The real models kvsim's real-model pages read, obtained from their original publications:
where each file comes from, its sha256, and the conversion to the layouts kvsim reads.

    python -m kvsim.models fetch   [--models DIR] [--mirror URL]   the original files, checked
    python -m kvsim.models convert [--models DIR]                  the layouts kvsim reads
    python -m kvsim.models verify  [--models DIR]                  every file against its sha256

A models folder (default_models(): $KVSIM_MODELS, else the checkout's models/ folder) holds one
folder per model:

    stories260K/   Karpathy's 260K-parameter llama2.c model (TinyStories), MIT: the original
                   checkpoint and tokenizer in llama2c/, converted to transformers'
                   LlamaForCausalLM layout (config.json, model.safetensors) with its vocabulary
                   (vocab.json, tokenizer.bin)
    mobilenet_v2/  Google's 8-bit MobileNetV2 (ImageNet, Coral test data), Apache-2.0: the
                   original TFLite file, labels and five photos, converted to graph.json +
                   model.safetensors (float32) with reference_outputs.json

No weights are in the repository: `fetch` downloads them (or copies them from `--mirror`, any URL
with the same layout, e.g. file:///path/to/models), checking each file's sha256.
"""

__all__ = ["MODELS", "File", "default_models"]

import os


class File:
    """One file of a models folder: its path under the model's folder, sha256 and size; `url`
    for an original file (fetched), None for a converted one (made by `convert`)."""

    def __init__(self, path, sha256, size, url=None):
        self.path, self.sha256, self.size, self.url = path, sha256, size, url


_TINYLLAMAS = ("https://huggingface.co/karpathy/tinyllamas/resolve/"
               "0bd21da7698eaf29a0d7de3992de8a46ef624add/stories260K/")
_LLAMA2C = "https://raw.githubusercontent.com/karpathy/llama2.c/master/"
_CORAL = ("https://raw.githubusercontent.com/google-coral/test_data/"
          "104342d2d3480b3e66203073dac24f4e2dbb4c41/")

# The sha256 of the originals equal the ones their publishers give (Hugging Face's LFS oids for
# tinyllamas; the Coral repository publishes git blob ids only, so these were taken from the
# files at the commit above). The converted files' are what `convert` writes from the originals.
MODELS = {
    "stories260K": [
        File("llama2c/stories260K.bin",
             "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696", 1056540,
             _TINYLLAMAS + "stories260K.bin"),
        File("llama2c/tok512.bin",
             "037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312", 6227,
             _TINYLLAMAS + "tok512.bin"),
        File("LICENSE", "e87b912002f04cdfa837eaf7f70548ab79b9cb62a285495edf575f3da875aec4", 1063,
             _LLAMA2C + "LICENSE"),
        File("config.json", "beda74649c0bf94547559fc4a8e9271213584601c8c396fb83066d5cfa8917ba",
             527),
        File("model.safetensors",
             "c549afd8464a1250200b5338d39d23d0bf096c7f6578944268d40512c133daa6", 1044992),
        File("tokenizer.bin", "037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312",
             6227),
        File("vocab.json", "3eaede661f7061dc1ef0d5d7d0a93ba0b7c788a3f9bda9cfedf65eb5f5bc6442",
             9952),
    ],
    "mobilenet_v2": [
        File("mobilenet_v2_1.0_224_quant.tflite",
             "7aad0c74c5e3c06e5eb3c827e13304fdd68a83da6087d92ee169c24ff9fd4776", 3610798,
             _CORAL + "mobilenet_v2_1.0_224_quant.tflite"),
        File("imagenet_labels.txt",
             "b8aaeb5630c62626a7d124a05c0e14230a7ffdd2136a31d0190a4fb71c1d82f1", 21686,
             _CORAL + "imagenet_labels.txt"),
        File("LICENSE", "f9946796a8a5bd5981565142fa42e3b0cc36aef6f80e86beaf5905b3c0fef1b5", 11361,
             _CORAL + "LICENSE"),
        File("images/grace_hopper.bmp",
             "c43444bf3b1b1e3080551ca194bd231da4b67f20fc91454502915a6b806b614f", 921738,
             _CORAL + "grace_hopper.bmp"),
        File("images/parrot.jpg",
             "a8fba9e7e29439fa414c13129aad661f2289ff891231920a7c33641b076f1833", 596977,
             _CORAL + "parrot.jpg"),
        File("images/cat.bmp", "34f235786382686111728287fd26d4c24dd8c25de8233469d6eeb301888ce0a9",
             523914, _CORAL + "cat.bmp"),
        File("images/bird.bmp",
             "3fd22d6ed352b8e721d9982e38ed655f8429e168bb53ad205c6f3cdfa848e994", 526986,
             _CORAL + "bird.bmp"),
        File("images/owl.jpg", "ea9a0e3943bbd0acaeb472a6e66e777d13cf76646f9e42e84cafa931cc8a5bf7",
             155944, _CORAL + "owl.jpg"),
        File("graph.json", "136cee1e7c33c57fa0bb841429e9b221aa209b68516ba3b952a6f4b9ea2eaec4",
             25844),
        File("model.safetensors",
             "cc60df2a09f972e28d22006cf8d00afe149abe97e70f41f75a3badcdfe3e887f", 13964852),
        File("reference_outputs.json",
             "4556f8393d37fc521fab0809703bde223abd507d6e5431c6cee3253c33e6828a", 2209),
    ],
}


def default_models(to_write=False):
    """$KVSIM_MODELS; else, in a checkout (this file under python/kvsim/models, or under
    build/python/kvsim/models once built), its models/ folder, or (to read, not `to_write`) a
    shared/models folder beside the checkout where models/ is absent and that one exists; else
    ./models."""
    if os.environ.get("KVSIM_MODELS"):
        return os.environ["KVSIM_MODELS"]
    here = os.path.dirname(os.path.abspath(__file__))
    for up in (3, 4):
        root = os.path.abspath(os.path.join(here, *[".."] * up))
        if os.path.exists(os.path.join(root, "CMakeLists.txt")):
            beside = os.path.join(os.path.dirname(root), "shared", "models")
            own = os.path.join(root, "models")
            if to_write or os.path.isdir(own) or not os.path.isdir(beside):
                return own
            return beside
    return os.path.abspath("models")
