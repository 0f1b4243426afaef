"""The local embedder against the machine's limit: spasm's sentences/s over the best bare
onnxruntime loop it finds, on the same texts, in the same run.

The texts are the distinct utterances of a synthetic run (``spasm.dataset.synthetic``: 12-70
words, conversational). The bare loops load the same ``model.onnx`` and ``tokenizer.json``
straight into onnxruntime and tokenizers (pad to the batch's longest text, sort by length,
mean pooling) and try batch sizes 4, 8, 16 and 32 with thread spinning off, and batch 8 with
spinning on (timed last: spinning threads slow whatever runs next); each configuration and
spasm's ``LocalOnnxEmbedder`` run ``--rounds`` times, interleaved, and each keeps its best
round (a shared machine's load moves between rounds).
It also prints the smallest cosine between spasm's vectors and the bare batch-32 loop's (the
reference recipe; the goal is >= 0.9999) and the peak RSS.

    .venv/bin/python benchmarks/embedder_limit.py [--texts 1000] [--rounds 2] [--threads 2]
    .venv/bin/python benchmarks/embedder_limit.py --ray       # + spasm eval --ray's embedder

``--ray`` also times :class:`spasm.evaluation.distributed.RayEmbedder` on a local Ray (one
one-thread worker per CPU of this machine) on the same texts, and prints its sentences/s over
spasm's local embedder's (goal >= 0.9: the overhead of Ray itself).

Not part of the test suite (minutes on 2 cores); the goal is a ratio >= 0.95.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from benchmarks._rss import peak_rss_mib  # noqa: E402 - needs ROOT on sys.path


def _texts(n: int) -> list[str]:
    from spasm.dataset.synthetic import synthesize_run
    from spasm.evaluation.loader import load_run

    with tempfile.TemporaryDirectory() as tmp:
        run = synthesize_run(Path(tmp) / "run", n_dialogues=max(8, n // 7), n_personas=max(4, n // 60))
        convs = load_run(run).conversations
    unique = list(dict.fromkeys(t for c in convs for t in c.texts))
    return unique[:n]


def _bare(
    model: Path, tokenizer_path: Path, threads: int, batch: int, spinning: bool
) -> Callable[[list[str]], Any]:
    """A bare onnxruntime loop: the model, the tokenizer, sorting by length, mean pooling."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.enable_padding()
    tokenizer.enable_truncation(256)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def embed(texts: list[str]) -> Any:
        out = np.zeros((len(texts), 384), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), batch):
            idx = order[start : start + batch]
            enc = tokenizer.encode_batch([texts[i] for i in idx])
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in names:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = session.run(None, feeds)[0]
            w = mask[..., None].astype(np.float32)
            pooled = (hidden * w).sum(axis=1) / np.clip(w.sum(axis=1), 1e-9, None)
            out[idx] = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return out

    return embed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=1000, help="distinct texts to embed (default 1000)")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per configuration (default 2)")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (default 2)")
    parser.add_argument("--ray", action="store_true",
                        help="also time spasm eval --ray's embedder on a local Ray")
    args = parser.parse_args()

    import numpy as np

    from spasm.evaluation.embeddings import LocalOnnxEmbedder

    texts = _texts(args.texts)
    words = [len(t.split()) for t in texts]
    print(f"{len(texts)} distinct texts, {min(words)}-{max(words)} words (mean {np.mean(words):.1f}); "
          f"{args.threads} threads, {args.rounds} rounds, best round kept; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    spasm = LocalOnnxEmbedder(threads=args.threads)
    configs: dict[str, Callable[[list[str]], Any]] = {
        f"bare batch {b}": _bare(spasm.model_path, spasm.tokenizer_path, args.threads, b, False)
        for b in (4, 8, 16, 32)
    }
    configs[f"spasm (batch {spasm.batch_size})"] = spasm.embed
    if args.ray:
        import ray

        from spasm.evaluation.distributed import RayEmbedder

        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
        distributed = RayEmbedder(ray, "local")
        configs[f"spasm --ray ({distributed.workers} workers)"] = distributed.embed
    for embed in configs.values():  # load every session and warm it up before timing
        embed(texts[:16])
    best: dict[str, float] = {}
    vectors: dict[str, Any] = {}
    for _ in range(args.rounds):
        for name, embed in configs.items():
            t0 = time.perf_counter()
            vectors[name] = embed(texts)
            rate = len(texts) / (time.perf_counter() - t0)
            best[name] = max(best.get(name, 0.0), rate)
    # Spinning threads keep the CPU busy after their session's run and slow whatever runs
    # next, so that configuration is timed last, alone, after every round of the others.
    spin = _bare(spasm.model_path, spasm.tokenizer_path, args.threads, 8, True)
    spin(texts[:16])
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        spin(texts)
        best["bare batch 8, spinning"] = max(best.get("bare batch 8, spinning", 0.0),
                                             len(texts) / (time.perf_counter() - t0))
    for name, rate in best.items():
        print(f"  {name:<26} {rate:7.1f} sentences/s")
    spasm_name = f"spasm (batch {spasm.batch_size})"
    bare = {k: v for k, v in best.items() if k.startswith("bare")}
    top = max(bare, key=lambda k: bare[k])
    cosine = float(np.min(np.sum(vectors[spasm_name] * vectors["bare batch 32"], axis=1)))
    print(f"spasm / best bare ({top}): {best[spasm_name] / bare[top]:.3f} (goal >= 0.95)")
    print(f"smallest cosine, spasm vs bare batch 32 (spasm's vectors before): {cosine:.6f} (goal >= 0.9999)")
    ray_name = next((k for k in best if k.startswith("spasm --ray")), None)
    if ray_name is not None:
        print(f"spasm --ray / spasm local: {best[ray_name] / best[spasm_name]:.3f} (goal >= 0.9)")
    print(f"peak RSS {peak_rss_mib():.0f} MiB (this process; Ray's workers not counted)")


if __name__ == "__main__":
    main()
