"""A compact trace's prompt statistics (traces/kvtrace-v1.md, "Compact traces") computed with
torch on the device the model runs on, so that a GPU capture never moves the prompt's queries to
the host: the column sums of the causal prefill attention per query head (plain, and of the
probabilities rounded to the file's dtype), and the text queries' head-averaged column sums and
maxima, of the prompt and of the context before the question.

The same definitions as kvsim's C++ (core/layer_attention.cpp: compute_prefill,
compute_text_query_stats), summed in another order: equal to kvsim.prompt_statistics to float32
rounding, not bit for bit, so replay of such a trace can differ from the full trace's where two
scores tie to the last bit. MEDA's prompt entropies are not computed here (a capture with device
statistics is written without them, as `kvsim compact --no-entropies`). Pure torch: the rules
for the question and the first kept row are restated here from traces/kvtrace.cpp and
sim/run/compact_trace.cpp because kvsim's C++ module is often not importable where the GPU is.
"""
import numpy as np

__all__ = ["question_length", "first_row", "prompt_statistics"]

PREFILL_BLOCK_ROWS = 64  # kPrefillBlockRows (core/layer_attention.hpp)


def question_length(modality, question_len=-1):
    """The prompt's question: question_len when given, else the text after the last media token
    (kvsim's question_length)."""
    if question_len >= 0:
        return int(question_len)
    media = np.flatnonzero(np.asarray(modality) != 0)
    return int(len(modality) - 1 - media[-1]) if len(media) else 0


def first_row(prompt_len, question, window):
    """The first query row a compact trace keeps (kvsim's compact_first_row)."""
    start = max(0, prompt_len - question - window)
    return start // PREFILL_BLOCK_ROWS * PREFILL_BLOCK_ROWS


def prompt_statistics(q, k, modality, scale, window=64, dtype="float16", question_len=-1,
                      block_rows=512):
    """One layer's statistics from its prompt rows on their device: q [H, P, d] and k [Hkv, P, d]
    torch tensors (as the model holds them, before rounding: they are rounded to `dtype` here, as
    the file stores them), modality [P]. Returns the dict kvsim.prompt_statistics returns, less
    "entropies", as numpy arrays."""
    import torch

    if dtype not in ("float16", "float32"):
        raise ValueError(f"prompt statistics: dtype '{dtype}': expected float16 or float32")
    store = torch.float16 if dtype == "float16" else torch.float32
    H, P, d = q.shape
    Hkv = k.shape[0]
    if Hkv < 1 or H % Hkv or k.shape[1] < P or k.shape[2] != d:
        raise ValueError(f"prompt statistics: q {list(q.shape)} and k {list(k.shape)} do not "
                         "match")
    group = H // Hkv
    # [Hkv, group, P, d]: a KV head's query heads share one product with its keys.
    qs = q.to(store).float().reshape(Hkv, group, P, d)
    ks = k[:, :P].to(store).float()
    modality = np.asarray(modality)[:P]
    question = question_length(modality, question_len)
    context = P - question
    is_text = torch.as_tensor(modality == 0, device=q.device)
    parts = {"prompt": P} if question == 0 else {"prompt": P, "context": context}
    sums = {name: torch.zeros(H, P, dtype=torch.float32, device=q.device) for name in
            ("column_sums", "column_sums_rounded")}
    text_sum = torch.zeros(P, dtype=torch.float32, device=q.device)
    text_max = torch.zeros(P, dtype=torch.float32, device=q.device)
    context_sums = {name: torch.zeros_like(v) for name, v in sums.items()}
    context_text_sum = torch.zeros_like(text_sum)
    context_text_max = torch.zeros_like(text_max)
    rows_all = torch.arange(P, device=q.device)
    for i0 in range(0, P, block_rows):
        i1 = min(P, i0 + block_rows)
        keys = i1  # causal: rows i0..i1-1 see keys [0, i1)
        logits = torch.matmul(qs[:, :, i0:i1], ks[:, :keys].transpose(1, 2)[:, None])
        logits = logits.reshape(H, i1 - i0, keys) * scale
        future = rows_all[:keys][None, :] > rows_all[i0:i1, None]
        probs = torch.softmax(logits.masked_fill(future, float("-inf")), dim=-1)
        rounded = probs.to(store).float()
        text_rows = is_text[i0:i1]
        mean = probs[:, text_rows].mean(0)  # [text rows, keys], head-averaged
        for target, t_sum, t_max, limit in ((sums, text_sum, text_max, P),
                                            (context_sums, context_text_sum, context_text_max,
                                             context)):
            if limit < P and i0 >= limit:
                continue
            _add_block(target, t_sum, t_max, probs, rounded, mean, text_rows,
                       min(i1, limit) - i0, min(keys, limit))
    out = {"context_len": context if question else 0,
           "first_row": first_row(P, question, window)}
    for name, length in parts.items():
        out[name] = _as_numpy(*((sums, text_sum, text_max) if name == "prompt" else
                                (context_sums, context_text_sum, context_text_max)), length)
    return out


def _add_block(target, t_sum, t_max, probs, rounded, mean, text_rows, n, cols):
    """A block's first n rows into the sums over its first `cols` keys: the column sums (as
    computed and rounded to the stored dtype), and the head-averaged text rows' sum and max."""
    import torch

    target["column_sums"][:, :cols] += probs[:, :n, :cols].sum(1)
    target["column_sums_rounded"][:, :cols] += rounded[:, :n, :cols].sum(1)
    text_n = int(text_rows[:n].sum())
    if text_n:
        block_mean = mean[:text_n, :cols]
        t_sum[:cols] += block_mean.sum(0)
        t_max[:cols] = torch.maximum(t_max[:cols], block_mean.max(0).values)


def _as_numpy(sums, text_sum, text_max, length):
    return {"column_sums": sums["column_sums"][:, :length].cpu().numpy(),
            "column_sums_rounded": sums["column_sums_rounded"][:, :length].cpu().numpy(),
            "text_column_sums": text_sum[:length].cpu().numpy(),
            "text_column_max": text_max[:length].cpu().numpy()}
