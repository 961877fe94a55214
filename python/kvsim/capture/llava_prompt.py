"""python -m kvsim.capture.llava_prompt: a kvsim prompt file (kvprompt v1) and language-model
checkpoint exported from a LLaVA model.

kvsim's live path runs only the language model; the vision tower and projector run here, once.
For an image and a question this writes:
  * PROMPT.h5: token_ids, modality (1 on image positions), segment, media_id and inputs_embeds,
    the projector's output for the image positions, plus reference_ids when --answer is given;
  * --save-lm DIR (optional): the language model as a LlamaForCausalLM checkpoint in the Hugging
    Face layout (config.json + safetensors) that `kvsim live` loads.

Needs torch, transformers (>= 4.45), pillow, h5py and numpy, and the model weights (imported when
run, not with kvsim.capture); kvsim's build and tests do not run it. Example:
  python3 -m kvsim.capture.llava_prompt --model llava-hf/llava-1.5-7b-hf --image cat.jpg \\
      --question "What is in the picture?" --answer "A cat." --out prompts.h5 --save-lm llava-lm
Several --image/--question pairs make several samples (000000, 000001, ...).
"""
import argparse

import h5py
import numpy as np
import torch
from PIL import Image
from transformers import AutoModelForCausalLM, AutoProcessor, LlavaForConditionalGeneration


def language_model(model: LlavaForConditionalGeneration):
    """The text decoder as a *ForCausalLM, whatever the transformers version nests it as."""
    inner = model.language_model
    if hasattr(inner, "lm_head"):
        return inner
    lm = AutoModelForCausalLM.from_config(model.config.text_config)
    state = {"model." + k: v for k, v in inner.state_dict().items()}
    state["lm_head.weight"] = model.lm_head.weight
    lm.load_state_dict(state)
    return lm.to(model.dtype)


def export_sample(group, model, processor, image_path, question, answer):
    image = Image.open(image_path).convert("RGB")
    conversation = [{"role": "user", "content": [{"type": "image"},
                                                 {"type": "text", "text": question}]}]
    text = processor.apply_chat_template(conversation, add_generation_prompt=True)
    inputs = processor(images=image, text=text, return_tensors="pt").to(model.device)
    ids = inputs["input_ids"][0]
    image_token = model.config.image_token_index
    vision = (ids == image_token).cpu().numpy()
    with torch.no_grad():
        # The projector's output: exactly the rows LLaVA substitutes for the image tokens.
        features = model.get_image_features(
            pixel_values=inputs["pixel_values"],
            vision_feature_layer=model.config.vision_feature_layer,
            vision_feature_select_strategy=model.config.vision_feature_select_strategy)
        if isinstance(features, (list, tuple)):
            features = torch.cat(list(features), 0)
    features = features.reshape(-1, features.shape[-1]).float().cpu().numpy()
    if features.shape[0] != vision.sum():
        raise SystemExit(f"{image_path}: {features.shape[0]} image features for "
                         f"{vision.sum()} image tokens")
    group["token_ids"] = ids.cpu().numpy().astype(np.int32)
    group["modality"] = vision.astype(np.uint8)
    group["segment"] = np.ones(len(ids), np.uint8)
    group["media_id"] = np.where(vision, 0, -1).astype(np.int32)
    group["inputs_embeds"] = features.astype(np.float16)
    group.attrs["task"] = "llava"
    if answer:
        ref = processor.tokenizer(answer, add_special_tokens=False)["input_ids"]
        group["reference_ids"] = np.asarray(ref, np.int32)
        group.attrs["reference"] = answer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="LLaVA model id or directory")
    p.add_argument("--image", action="append", required=True)
    p.add_argument("--question", action="append", required=True)
    p.add_argument("--answer", action="append", default=[])
    p.add_argument("--out", required=True, help="prompt file to write")
    p.add_argument("--save-lm", help="also save the language model here (HF layout)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    if len(a.image) != len(a.question):
        raise SystemExit("give one --question per --image")
    processor = AutoProcessor.from_pretrained(a.model)
    model = LlavaForConditionalGeneration.from_pretrained(
        a.model, torch_dtype=torch.float16).to(a.device).eval()
    with h5py.File(a.out, "w") as f:
        f.attrs["kvprompt_version"] = 1
        f.attrs["model"] = a.model
        for i, (image, question) in enumerate(zip(a.image, a.question)):
            answer = a.answer[i] if i < len(a.answer) else None
            export_sample(f.create_group(f"samples/{i:06d}"), model, processor, image, question,
                          answer)
    if a.save_lm:
        language_model(model).save_pretrained(a.save_lm, safe_serialization=True)


if __name__ == "__main__":
    main()
