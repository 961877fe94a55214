"""A real trained checkpoint end to end: Karpathy's stories260K (TinyStories, LLaMA-2
architecture, 5 layers, 8 query heads on 4 KV heads), read from $KVSIM_MODELS/stories260K (by
default the checkout's models/: `python -m kvsim.models fetch`), never committed. Skipped, with
exit code 77 and a message saying why, when the model is absent.

Checked: greedy decoding from the start token reproduces the published sample; kvsim.prompts
writes prompts from text that capture and evaluate read; the captured real trace replays and
its statistics compute.
"""
import os
import tempfile
import unittest

import numpy as np

import kvsim
from kvsim import prompts

from real_models import MODELS, kvsim_cli, main_or_skip

MODEL = os.path.join(MODELS, "stories260K")

# The published greedy sample (temperature 0, from the start token) of karpathy/tinyllamas
# stories260K/readme.md, as its PROVENANCE.md quotes it.
PUBLISHED = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
             "the park. One day, she saw a big, red ball. She wanted to play with it, but it was "
             "too high.\nLily")


class Stories260K(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.vocab = prompts.Llama2cVocab(MODEL)

    def test_greedy_decoding_reproduces_the_published_sample(self):
        p = prompts.write(os.path.join(self.dir, "bos.h5"), [[self.vocab.bos_id]])
        trace = os.path.join(self.dir, "bos_trace.h5")
        kvsim_cli("live", "capture", "-m", MODEL, "--prompts", p, "--gen", "256", "-o", trace,
                  "--backend", "cpu")
        ids = kvsim.Trace(trace)["000000"].token_ids
        self.assertEqual(len(ids), 257)  # the start token and 256 generated
        text = self.vocab.decode(ids)
        self.assertTrue(text.startswith(PUBLISHED), repr(text[:300]))

    def test_load_tokenizer_finds_the_llama2c_vocabulary(self):
        tokenize, bos = prompts.load_tokenizer(MODEL)
        self.assertEqual(bos, 1)
        self.assertEqual(tokenize("Once upon a time"), self.vocab.encode("Once upon a time"))

    def test_the_vocabulary_round_trips_text(self):
        text = 'Tim had a red kite. "Look!" he said, and it flew over the big tree.'
        ids = self.vocab.encode(text)
        self.assertNotIn(self.vocab.bos_id, ids)
        self.assertEqual(self.vocab.decode([self.vocab.bos_id] + ids), text)
        # merges happened: far fewer tokens than characters
        self.assertLess(len(ids), len(text) // 2)

    def test_prompts_from_text_capture_replay_and_stats_on_a_real_trace(self):
        story = ("Once upon a time, there was a little dog named Max. Max liked to run in the "
                 "garden. One day, he found a big stick under a tree.")
        samples = prompts.from_texts(self.vocab, [story], references=[" He was very happy."],
                                     bos=self.vocab.bos_id)
        ids = samples["000000"]["token_ids"]
        self.assertEqual(ids[0], self.vocab.bos_id)
        # the reference is tokenized without a start token
        self.assertEqual(samples["000000"]["reference_ids"], self.vocab.encode(" He was very happy."))
        p = prompts.write(os.path.join(self.dir, "story.h5"), samples)
        trace = os.path.join(self.dir, "story_trace.h5")
        kvsim_cli("live", "capture", "-m", MODEL, "--prompts", p, "--gen", "24", "-o", trace)
        t = kvsim.Trace(trace)
        self.assertEqual((t.num_layers, t.num_heads, t.num_kv_heads, t.head_dim), (5, 8, 4, 8))
        s = t["000000"]
        np.testing.assert_array_equal(s.token_ids[: len(ids)], ids)
        df = kvsim.replay(trace, ["full", "h2o", "streamingllm"], budget="30%", as_frame=True)
        means = df.groupby("policy")["mass_recall"].mean()
        self.assertEqual(means["full"], 1.0)
        self.assertLess(means["streamingllm"], 1.0)
        self.assertGreater(means["h2o"], 0.5)
        stats = kvsim.stats(trace, as_frame=True)
        self.assertEqual(list(stats["layer"]), [0, 1, 2, 3, 4])

    def test_stop_at_eos_where_llama2c_stops(self):
        # llama2.c's TinyStories models separate stories with the start token (run.c stops
        # generating at token 1); config.json's eos_token_id 2 never comes. A
        # generation_config.json naming both makes --stop-at-eos stop where llama2.c stops.
        model = os.path.join(self.dir, "stories260K_eos")
        os.makedirs(model, exist_ok=True)
        for name in ("config.json", "model.safetensors"):
            if not os.path.exists(os.path.join(model, name)):
                os.symlink(os.path.abspath(os.path.join(MODEL, name)), os.path.join(model, name))
        with open(os.path.join(model, "generation_config.json"), "w") as f:
            f.write('{"eos_token_id": [1, 2]}')
        story = "Once upon a time, there was a cat. The cat was happy. The end."
        p = prompts.write(os.path.join(self.dir, "end.h5"),
                          prompts.from_texts(self.vocab, [story], bos=self.vocab.bos_id))
        full = os.path.join(self.dir, "end_full.h5")
        kvsim_cli("live", "capture", "-m", model, "--prompts", p, "--gen", "300", "-o", full)
        s = kvsim.Trace(full)["000000"]
        generated = list(s.token_ids[s.prompt_len:])
        self.assertIn(1, generated, "the model starts a new story within 300 tokens")
        k = generated.index(1)
        stopped = os.path.join(self.dir, "end_stopped.h5")
        kvsim_cli("live", "capture", "-m", model, "--prompts", p, "--gen", "300", "--stop-at-eos",
                  "-o", stopped)
        s = kvsim.Trace(stopped)["000000"]
        self.assertEqual(s.gen_len, k + 1)
        self.assertEqual(list(s.token_ids[s.prompt_len:]), generated[: k + 1])


if __name__ == "__main__":
    main_or_skip(("stories260K/config.json",), "the stories260K checkpoint is")
