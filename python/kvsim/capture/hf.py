"""Capture kvtrace v1 files from Hugging Face transformers models: the Recorder registered as an
attention function (AttentionInterface), image and video positions from the processor's output
and the model's config, greedy generation with a full cache, batch 1.

    from transformers import AutoModelForImageTextToText, AutoProcessor
    from kvsim.capture import hf
    model = AutoModelForImageTextToText.from_pretrained(path)
    processor = AutoProcessor.from_pretrained(path)
    hf.capture_pretrained(model, processor, [{"name": "000000", "text": prompt,
                                              "images": [image]}], "trace.h5", gen=32)

    python -m kvsim.capture --model DIR --prompts prompts.jsonl --out trace.h5 --gen 32

Written against transformers 4.57 from its source: `modeling_utils.AttentionInterface` (a
registry read by every attention module as ALL_ATTENTION_FUNCTIONS[config._attn_implementation],
called as fn(module, query, key, value, attention_mask, scaling=..., dropout=..., **kwargs) with
query [B, H, n, d] and key/value [B, Hkv, T, d] after the rotary embedding and the cache update),
`PreTrainedModel.set_attn_implementation`, models/llama (decoder attention modules carry
`layer_idx`), models/llava (`image_token_index`, renamed `image_token_id` in later versions) and
models/qwen2_vl (`image_token_id`, `video_token_id`, `image_grid_thw`, `video_grid_thw`,
`spatial_merge_size`; M-RoPE is applied before the attention function, so q and k arrive
rotated; vision-tower attention modules have no `layer_idx` and pass through unrecorded).
transformers cannot be installed where kvsim was developed: the parts that do not need it are
tested against small PyTorch models with the same calling convention
(python/tests/test_capture_hf.py), and experiments/live_gpu/check_hf_capture.py checks the whole
on real transformers classes: it passed on the GPU machine with transformers 5.17.0.
"""
import numpy as np

from . import CaptureError, Recorder, eager_attention

ATTENTION_NAME = "kvsim_capture"


def _inner_attention():
    """transformers' own sdpa function when it exists (the model then computes exactly what it
    computes with attn_implementation="sdpa"), else kvsim's eager attention."""
    try:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward
    except ImportError:
        return eager_attention


def register(recorder, name=ATTENTION_NAME, inner=None):
    """Registers recorder.attention under `name` in transformers' AttentionInterface (and the
    sdpa mask format under the same name where AttentionMaskInterface exists, so the model
    builds the masks the inner function expects). Returns the name."""
    import transformers

    recorder.inner = inner or _inner_attention()
    transformers.AttentionInterface.register(name, recorder.attention)
    masks = getattr(transformers, "AttentionMaskInterface", None)
    if masks is not None and "sdpa" in getattr(masks, "_global_mapping", {}):
        masks.register(name, masks._global_mapping["sdpa"])
    return name


def use_attention(model, name=ATTENTION_NAME):
    """Makes the model (and its sub-models: language model, vision tower) call the function
    registered as `name`: model.set_attn_implementation where transformers has it, else the
    configs' _attn_implementation."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
        return
    seen, todo = set(), [model.config]
    while todo:
        config = todo.pop()
        if id(config) in seen:
            continue
        seen.add(id(config))
        config._attn_implementation = name
        for key in getattr(config, "sub_configs", {}) or {}:
            sub = getattr(config, key, None)
            if sub is not None:
                todo.append(sub)


def _token_id(config, *names):
    for owner in (config, getattr(config, "text_config", None)):
        for n in names:
            v = getattr(owner, n, None) if owner is not None else None
            if v is not None:
                return int(v)
    return None


def _sizes(grid_thw, merge, per_frame):
    """Tokens per media item from (t, h, w) grids: one item per image, or one per temporal
    patch (frame) of a video, h·w / merge² tokens each."""
    if hasattr(grid_thw, "tolist"):  # a tensor, possibly on the GPU
        grid_thw = grid_thw.tolist()
    out = []
    for t, h, w in np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3):
        each = int(h * w) // (merge * merge)
        out += [each] * int(t) if per_frame else [int(t) * each]
    return out


def media_positions(input_ids, config, image_grid_thw=None, video_grid_thw=None, num_images=None):
    """modality (uint8 [P]: 0 text, 1 image, 2 video) and media_id (int32 [P], -1 on text) of a
    prompt's token ids. Image tokens carry config.image_token_id (or image_token_index, LLaVA),
    video tokens video_token_id. Each image is one media item and each video frame (temporal
    patch) another, numbered in the order they appear: sizes from image_grid_thw /
    video_grid_thw and vision_config.spatial_merge_size (Qwen2-VL), else the image tokens split
    equally over `num_images` (LLaVA: every image has the same count; default: each contiguous
    run of image tokens is one image)."""
    ids = np.asarray(input_ids).reshape(-1)
    modality = np.zeros(len(ids), dtype=np.uint8)
    media = np.full(len(ids), -1, dtype=np.int32)
    merge = int(getattr(getattr(config, "vision_config", None), "spatial_merge_size", 1) or 1)
    items = []  # (first position, positions) of every media item
    for kind, names, grid, per_frame in ((1, ("image_token_id", "image_token_index"),
                                          image_grid_thw, False),
                                         (2, ("video_token_id",), video_grid_thw, True)):
        token = _token_id(config, *names)
        if token is None:
            continue
        where = np.flatnonzero(ids == token)
        if len(where) == 0:
            continue
        modality[where] = kind
        if grid is not None:
            sizes = _sizes(grid, merge, per_frame)
        elif kind == 1 and num_images:
            if len(where) % num_images:
                raise CaptureError(f"capture: {len(where)} image tokens do not split equally "
                                   f"over {num_images} images")
            sizes = [len(where) // num_images] * num_images
        else:  # contiguous runs
            breaks = np.flatnonzero(np.diff(where) != 1) + 1
            sizes = [len(r) for r in np.split(where, breaks)]
        if sum(sizes) != len(where):
            raise CaptureError(f"capture: the grids give {sum(sizes)} "
                               f"{'image' if kind == 1 else 'video'} tokens, the prompt has "
                               f"{len(where)}")
        start = 0
        for n in sizes:
            items.append((int(where[start]), where[start:start + n]))
            start += n
    for number, (_, positions) in enumerate(sorted(items, key=lambda item: item[0])):
        media[positions] = number
    return modality, media


def _prompt_inputs(processor, prompt):
    """The processor's tensors for one prompt dict: text (or chat messages through the chat
    template), optional images and videos."""
    text = prompt.get("text")
    if text is None and "messages" in prompt:
        text = processor.apply_chat_template(prompt["messages"], add_generation_prompt=True,
                                             tokenize=False)
    if text is None:
        raise CaptureError(f"capture: prompt '{prompt.get('name')}' has neither text nor messages")
    kwargs = {"text": text, "return_tensors": "pt"}
    for key in ("images", "videos"):
        if prompt.get(key):
            kwargs[key] = prompt[key]
    try:
        return processor(**kwargs)
    except TypeError:  # a tokenizer: text only
        if len(kwargs) > 2:
            raise
        return processor(text, return_tensors="pt")


def language_model(model):
    """The decoder stack a vision-language model hands its input embeddings to: model.model.
    language_model (LLaVA and Qwen2-VL since transformers 4.52), model.language_model (LLaVA
    before), model.model (Qwen2-VL before); None when the model has none of them."""
    inner = getattr(model, "model", None)
    for candidate in (getattr(inner, "language_model", None), getattr(model, "language_model", None),
                      inner):
        if candidate is not None and callable(getattr(candidate, "forward", None)):
            return candidate
    return None


class DecoderInputs:
    """Keeps what the language model receives in its first call of a sample (the prefill): the
    `inputs_embeds` [1, P, hidden] (token embeddings with the vision tower's rows merged in) and
    the `position_ids` ([3, 1, P] under M-RoPE; transformers 5 may prepend the text positions as
    a fourth row). It wraps the module's forward for as long as it is installed."""

    def __init__(self, module):
        self.module, self.first = module, None
        self.original = module.forward
        module.forward = self

    def __call__(self, *args, **kwargs):
        if self.first is None:
            self.first = (kwargs.get("inputs_embeds"), kwargs.get("position_ids"))
        return self.original(*args, **kwargs)

    def take(self):
        first, self.first = self.first, None
        return first or (None, None)

    def remove(self):
        del self.module.forward


def rotary_of(config):
    """(rope_theta, mrope_section) of a model's rotary embedding as its config states them (the
    text config's when there is one; transformers 5's rope_parameters or the older rope_theta and
    rope_scaling), each None when unknown. rope_theta is None under a scaled variant (linear,
    dynamic, yarn, llama3, ...), which the trace's plain rope_theta would misdescribe."""
    text = getattr(config, "text_config", None) or config
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if not isinstance(params, dict):
        params = {}
    theta = params.get("rope_theta", getattr(text, "rope_theta", None))
    section = params.get("mrope_section")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "mrope", None) and section is None:
        theta = None
    return (float(theta) if theta is not None else None,
            [int(x) for x in section] if section is not None else None)


def generated_position_ids(prompt_ids, gen):
    """The M-RoPE ids [3, P + gen] of a prompt's ids [3, P] followed by `gen` generated tokens:
    Qwen2-VL places each new token one past the largest id so far on all three axes
    (get_rope_index's rope_deltas)."""
    prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
    start = int(prompt_ids.max()) + 1 if prompt_ids.size else 0
    tail = np.tile(np.arange(start, start + gen, dtype=np.int64), (3, 1))
    return np.concatenate([prompt_ids, tail], axis=1).astype(np.int32)


def reference_of(prompt, field):
    """A prompt's reference answer: its `field` (a dataset's answer column), the first of a list
    of answers (VQA's several annotators), or None."""
    value = prompt.get(field)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return None if value is None else str(value)


def reference_token_ids(processor, reference):
    """The reference answer's token ids as the model's tokenizer spells it on its own, without
    special tokens (what `kvsim live evaluate` teacher-forces after the prompt for ΔNLL)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    ids = tokenizer(reference, add_special_tokens=False)["input_ids"]
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    return [int(i) for i in ids]


def prompt_sample(name, token_ids, modality, media_id, embeds, position_ids, task=None,
                  reference=None, reference_ids=None):
    """A kvprompt sample (kvsim.prompts.write) of what the language model received: the token
    ids, the input embeddings at the media positions, and for M-RoPE the three position ids of
    each token ([P, 3]); with the reference answer (text, and its token ids) when given. Raises
    CaptureError naming the sample when media positions have no embeddings."""
    P = len(token_ids)
    sample = {"token_ids": [int(i) for i in token_ids], "modality": modality,
              "media_id": media_id, "segment": np.ones(P, dtype=np.uint8)}
    if task:
        sample["task"] = task
    if reference is not None:
        sample["reference"] = reference
        if reference_ids:
            sample["reference_ids"] = reference_ids
    media = np.flatnonzero(np.asarray(modality) != 0)
    if len(media):
        if embeds is None:
            raise CaptureError(f"capture: sample '{name}': the language model received no "
                               "inputs_embeds, so the image rows cannot be written")
        rows = embeds.detach().float().cpu().numpy().reshape(-1, embeds.shape[-1])
        if rows.shape[0] != P:
            raise CaptureError(f"capture: sample '{name}': inputs_embeds has {rows.shape[0]} rows "
                               f"for {P} prompt tokens")
        sample["inputs_embeds"] = rows[media].astype(np.float32)
    if position_ids is not None and position_ids.dim() == 3:
        ids = position_ids.detach().cpu().numpy()[-3:, 0, :P]  # drop a leading text row
        sample["position_ids"] = ids.T.astype(np.int32)
    return sample


def capture_pretrained(model, processor, prompts, out, gen=32, dtype="float16", model_name=None,
                       progress=None, prompts_out=None, compact_window=None,
                       compact_entropies=True, compact_on_device=False, compact_threads=0,
                       reference_field="reference", force=False):
    """Greedy generation with a full cache for each prompt (batch 1), recording every decoder
    layer's q (after the rotary embedding), k and v at every position, written to `out` as a
    kvtrace v1 file. prompts: dicts with "name", "text" (or "messages"), optional "images",
    "videos", "task". `gen` decode steps are recorded per prompt: transformers' generate runs
    gen + 1 new tokens, the last of which is never fed back. With `prompts_out`, also writes the
    prompts as a kvprompt file (the token ids, the language model's input embeddings at the
    media positions, M-RoPE position ids), so that `kvsim live` runs the very same inputs on the
    checkpoint, and each prompt's reference answer (its `reference_field`, a dataset's answer
    column; the first of a list) as the `reference` attribute and its token ids, which `kvsim live
    evaluate` scores the answers and ΔNLL against. With `compact_window`, writes a compact trace (Recorder.compact): each layer's
    prompt statistics computed as the model runs, only the query rows windows of up to that many
    rows read kept (compact_on_device: computed with torch where the model runs, without the
    entropies; Recorder.compact; compact_threads: the host's threads for them, 0 every core).
    Before any generation, `out` and `prompts_out` are checked as
    every kvsim output is: an existing trace (prompt file) there is replaced only with force=True;
    neither may be the other. Returns the Recorder."""
    from kvsim._kvsim import check_outputs

    check_outputs([(out, "out", "trace"), (prompts_out or "", "prompts_out", "prompts")],
                  force=force)
    recorder = Recorder()
    if compact_window:
        recorder.compact(compact_window, dtype, compact_entropies, on_device=compact_on_device,
                         threads=compact_threads)
    use_attention(model, register(recorder))
    model.eval()
    config = model.config
    recorder.rope_theta, recorder.mrope_section = rotary_of(config)
    decoder = None
    if prompts_out or recorder.mrope_section is not None:
        lm = language_model(model)
        if lm is None:
            raise CaptureError("capture: prompts_out and M-RoPE position ids need the model's "
                               "language model (found none of model.model.language_model, "
                               "model.language_model, model.model)")
        decoder = DecoderInputs(lm)
    samples = {}
    try:
        _capture_all(model, processor, prompts, gen, recorder, decoder, samples, progress,
                     prompts_out, reference_field)
    finally:
        if decoder is not None:
            decoder.remove()
    recorder.write(out, model=model_name or getattr(config, "_name_or_path", "") or "",
                   dtype=dtype, force=force)
    if prompts_out:
        from kvsim.prompts import write
        write(prompts_out, samples, model=model_name or getattr(config, "_name_or_path", "") or "",
              force=force)
    return recorder


def _capture_all(model, processor, prompts, gen, recorder, decoder, samples, progress,
                 prompts_out, reference_field):
    import torch

    config = model.config
    for i, prompt in enumerate(prompts):
        name = str(prompt.get("name", f"{i:06d}"))
        inputs = _prompt_inputs(processor, prompt)
        ids = inputs["input_ids"]
        if ids.shape[0] != 1:
            raise CaptureError(f"capture: prompt '{name}' is a batch of {ids.shape[0]}")
        P = ids.shape[1]
        modality, media = media_positions(
            ids[0].tolist(), config, image_grid_thw=inputs.get("image_grid_thw"),
            video_grid_thw=inputs.get("video_grid_thw"),
            num_images=len(prompt.get("images") or []) or None)
        T = P + gen
        segment = np.r_[np.ones(P), np.full(gen, 2)].astype(np.uint8)
        with recorder.sample(name, modality=np.r_[modality, np.zeros(gen, np.uint8)],
                             segment=segment, media_id=np.r_[media, np.full(gen, -1, np.int32)],
                             task=prompt.get("task")):
            with torch.no_grad():
                output = model.generate(**inputs, max_new_tokens=gen + 1, min_new_tokens=gen + 1,
                                        do_sample=False, num_beams=1, use_cache=True)
            sequence = output[0] if not hasattr(output, "sequences") else output.sequences[0]
            recorder.set_token_ids(sequence[:T].tolist())
            embeds, position_ids = decoder.take() if decoder is not None else (None, None)
            if recorder.mrope_section is not None:
                if position_ids is None or position_ids.dim() != 3:
                    raise CaptureError(f"capture: prompt '{name}': the model's config has M-RoPE "
                                       "(mrope_section) but its language model received no "
                                       "[3, 1, P] position_ids")
                prompt_ids = position_ids.detach().cpu().numpy()[-3:, 0, :P]  # drop a text row
                recorder.set_position_ids(generated_position_ids(prompt_ids, gen))
        if prompts_out:
            reference = reference_of(prompt, reference_field)
            samples[name] = prompt_sample(
                name, ids[0].tolist(), modality, media, embeds, position_ids,
                task=prompt.get("task"), reference=reference,
                reference_ids=reference_token_ids(processor, reference) if reference else None)
        if progress:
            progress(i + 1, len(prompts))
