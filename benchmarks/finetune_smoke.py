"""Fine-tuning smoke test on an export: a few steps of a small causal LM, assistant-only loss.

Opt-in: torch is large. It needs ``torch`` (the CPU build is enough), ``trl``
(0.20 or later, for ``assistant_only_loss``) and a small chat model — by default
``HuggingFaceTB/SmolLM2-135M-Instruct`` from the local Hugging Face cache, or ``--model PATH``.
Without any of them it prints why it skipped and exits 0::

    pip install torch --index-url https://download.pytorch.org/whl/cpu && pip install 'trl>=0.20'
    .venv/bin/python benchmarks/finetune_smoke.py                          # a synthetic run, exported
    .venv/bin/python benchmarks/finetune_smoke.py --export exports/smoke   # an existing hf export
    .venv/bin/python benchmarks/finetune_smoke.py --steps 20 --download    # fetch the model if missing

What it does: exports a small synthetic run (``--role responder --weights``; or takes
``--export DIR``), loads its ``hf`` Parquet with ``datasets.load_dataset(DIR)``, gives the
tokenizer a ChatML template whose ``{% generation %}`` markers wrap only the ``assistant``
messages with weight 1 (a turn with weight 0 is context, not a target), and trains ``--steps``
steps with TRL's ``SFTTrainer(assistant_only_loss=True)``. It prints the loss on the training
examples before and after, and how many tokens the loss covers. The loss falling is the check:
the export is a dataset TRL trains on as it is, masks included.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import fields
from importlib.util import find_spec
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

_TIKTOKEN = ROOT.parent / "shared" / "data" / "tiktoken"
if _TIKTOKEN.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_TIKTOKEN))

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
_INSTALL = ("pip install torch --index-url https://download.pytorch.org/whl/cpu && "
            "pip install 'trl>=0.20'")

#: ChatML (SmolLM2's own format) with generation markers around the trained turns only.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' and m['weight'] != 0 %}"
    "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
)


def skip_reason() -> str | None:
    """Why the benchmark cannot run here (``None``: it can)."""
    missing = [name for name in ("torch", "trl", "transformers", "datasets") if find_spec(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (opt-in: {_INSTALL})"
    from trl import SFTConfig

    if "assistant_only_loss" not in {f.name for f in fields(SFTConfig)}:
        return f"trl is too old for assistant_only_loss (needs 0.20 or later: {_INSTALL})"
    return None


def _export(work: Path, dialogues: int) -> Path:
    from spasm.dataset.synthetic import synthesize_run
    from spasm.export.pipeline import ExportOptions, export_run

    run = synthesize_run(work / "run", n_dialogues=dialogues, n_personas=max(1, dialogues // 4))
    out = work / "export"
    export_run(run, out, ExportOptions(formats=["hf"], role="responder", weights=True, split=(1.0,)))
    return out


def _load(model_name: str, download: bool) -> tuple[Any, Any] | str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_name, local_files_only=not download)
        model = AutoModelForCausalLM.from_pretrained(model_name, local_files_only=not download)
    except OSError as exc:
        return (f"model {model_name} not available ({str(exc).splitlines()[0]}); pass --model PATH to a "
                "local copy, or --download")
    tokenizer.chat_template = CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, help="an export with hf files (default: a synthetic one)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"a small causal LM (default {DEFAULT_MODEL})")
    parser.add_argument("--download", action="store_true", help="let transformers download the model")
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--dialogues", type=int, default=16, help="synthetic dialogues (default 16)")
    parser.add_argument("--max-length", type=int, default=512, help="tokens per example (default 512)")
    args = parser.parse_args(argv)

    reason = skip_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    import datasets
    import torch
    from trl import SFTConfig, SFTTrainer

    loaded = _load(args.model, args.download)
    if isinstance(loaded, str):
        print(f"skipped: {loaded}")
        return 0
    tokenizer, model = loaded
    with tempfile.TemporaryDirectory(prefix="spasm-finetune-") as tmp:
        folder = args.export or _export(Path(tmp), args.dialogues)
        train = datasets.load_dataset(str(folder))["train"].select_columns(["messages"])
        config = SFTConfig(
            output_dir=str(Path(tmp) / "trainer"), max_steps=args.steps, per_device_train_batch_size=2,
            per_device_eval_batch_size=2, learning_rate=1e-4, logging_steps=1, save_strategy="no",
            report_to=[], assistant_only_loss=True, max_length=args.max_length, seed=0,
            use_cpu=not torch.cuda.is_available(),
        )
        trainer = SFTTrainer(model=model, args=config, train_dataset=train, eval_dataset=train,
                             processing_class=tokenizer)
        processed = trainer.train_dataset
        targets = sum(sum(r["assistant_masks"]) for r in processed)
        tokens = sum(len(r["input_ids"]) for r in processed)
        before = trainer.evaluate()["eval_loss"]
        trainer.train()
        after = trainer.evaluate()["eval_loss"]
    print(f"{len(train)} examples from {folder}; the loss covers {targets:,} of {tokens:,} tokens "
          "(assistant turns with weight 1)")
    print(f"{args.model}, {args.steps} steps on {'cuda' if torch.cuda.is_available() else 'cpu'}: "
          f"loss before {before:.4f}, after {after:.4f} ({'fell' if after < before else 'DID NOT FALL'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
