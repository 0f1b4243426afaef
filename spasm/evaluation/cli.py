"""The ``eval``, ``compare`` and ``import`` sub-commands (wired in by ``spasm/cli.py``).

Each handler takes the parsed :class:`argparse.Namespace` and returns an exit code; bad
input raises :class:`spasm.errors.UserError`, which the main CLI turns into exit code 2.
Choices are checked here, not by argparse, so that the error is a ``UserError`` too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spasm.errors import UserError

if TYPE_CHECKING:
    from spasm.config import BackendConfig

__all__ = ["cmd_compare", "cmd_eval", "cmd_import", "register"]

OPENAI_BASE_URL = "https://api.openai.com/v1"


def _add_eval_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (runs/<name>)")
    p.add_argument(
        "--embedder",
        metavar="NAME",
        default="local",
        help="embedding model: local (default, offline MiniLM), static (a distilled token table of "
        "the same MiniLM: ~100x faster, for corpus-scale runs), openai, sentence-transformers",
    )
    p.add_argument(
        "--embedding-model",
        metavar="MODEL",
        default=None,
        help="model name for --embedder openai / sentence-transformers",
    )
    p.add_argument(
        "--embedding-base-url",
        metavar="URL",
        default=None,
        help="base URL of an OpenAI-compatible embeddings endpoint",
    )
    p.add_argument(
        "--embedding-api-key-env",
        metavar="VAR",
        default="OPENAI_API_KEY",
        help="NAME of the environment variable with the embeddings key ('none': the endpoint needs no key)",
    )
    p.add_argument(
        "--device",
        metavar="cpu|cuda",
        default="cpu",
        help="where --embedder local (onnxruntime's CUDA provider: pip install 'spasm[gpu]') or "
        "sentence-transformers runs (default cpu)",
    )
    p.add_argument(
        "--mode",
        metavar="cheap|probe",
        default="cheap",
        help="drift mode: cheap (utterances, default) or probe (LLM-stated stances)",
    )
    p.add_argument(
        "--judge",
        action="store_true",
        help="decide echoing with an LLM judge (the run's own backend unless told otherwise)",
    )
    p.add_argument(
        "--consistency",
        action="store_true",
        help="judge persona consistency (prompt-to-line, line-to-line; Q&A when the run has "
        "harness.persona_probes answers) with the LLM judge(s)",
    )
    p.add_argument(
        "--simulator-errors",
        action="store_true",
        help="review the simulated user's own errors with the LLM judge (tau2's tags and "
        "severities); the share of failed dialogues with a critical simulator error",
    )
    p.add_argument(
        "--judge-backend",
        metavar="NAME",
        action="append",
        default=[],
        help="a judge for every LLM-judged metric: a backend of RUN_DIR/config.json or 'embedded'; "
        "repeat for an ensemble (agreement and disagreements reported); alone it turns on --judge",
    )
    p.add_argument(
        "--llm-backend",
        metavar="NAME",
        default=None,
        help="backend of RUN_DIR/config.json for --mode probe / --judge (default: the first "
        "pairing's client), or 'embedded' for the embedded model",
    )
    p.add_argument(
        "--llm-model",
        metavar="MODEL",
        default=None,
        help="use an OpenAI-compatible endpoint instead: the chat model for probe/judge",
    )
    p.add_argument(
        "--llm-base-url",
        metavar="URL",
        default=None,
        help=f"base URL of that endpoint (default {OPENAI_BASE_URL})",
    )
    p.add_argument(
        "--llm-api-key-env",
        metavar="VAR",
        default="OPENAI_API_KEY",
        help="NAME of the environment variable with that endpoint's key ('none': no key)",
    )
    p.add_argument(
        "--llm-max-tokens",
        metavar="N",
        type=int,
        default=400,
        help="cap on each probe/judge reply (default 400)",
    )
    p.add_argument(
        "--retrieval",
        metavar="card|centroid",
        default="card",
        help="Acc@K against persona cards (card, default) or leave-one-out centroids",
    )
    p.add_argument(
        "--reference",
        metavar="OTHER",
        default=None,
        help="a run or imported dataset (e.g. human dialogues) to z-score the realism metrics against",
    )
    p.add_argument(
        "--baseline",
        metavar="CONDITION",
        default=None,
        help="the condition every other one is compared with (default: ecp when present)",
    )
    p.add_argument(
        "--own-ngram",
        metavar="N",
        type=int,
        default=4,
        help="own content: a Client word is copied when it lies in a run of at least N words an "
        "earlier utterance of the dialogue contains (default 4)",
    )
    p.add_argument(
        "--own-min-words",
        metavar="N",
        type=int,
        default=4,
        help="own content: an utterance something was cut from is left out when it keeps fewer "
        "than N words (default 4)",
    )
    p.add_argument(
        "--own-consistency",
        action="store_true",
        help="with --consistency, also judge prompt-to-line on the Client's own content (copied "
        "spans removed): one more call per dialogue whose Client copied",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        nargs="?",
        const="",
        default=None,
        help="run the embedding and the per-dialogue stages (realism, language, echoing, the "
        "echoing judge) on a Ray cluster: one worker per CPU, each with its own model session (at "
        "ADDRESS, else RAY_ADDRESS, else a local Ray; pip install 'spasm[ray]'; docs/cluster.md)",
    )
    p.add_argument("--concurrency", metavar="N", type=int, default=8, help="LLM calls in flight")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``eval``, ``compare`` and ``import`` sub-commands to the main parser."""
    p = subparsers.add_parser(
        "eval",
        help="measure drift, echoing and persona separability of a run",
        description="Compute drift, echoing and persona separability; write RUN_DIR/eval/"
        "metrics.json and a self-contained report.html.",
    )
    _add_eval_options(p)
    p.add_argument("--out", metavar="DIR", default=None, help="output directory (default RUN_DIR/eval)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier evaluation at an --out outside the run")
    p.add_argument("--dry-run", action="store_true",
                   help="print how many texts would be embedded (after the embedding cache) and "
                   "the expected time at a rate measured now on a sample; evaluate nothing")
    p.set_defaults(func=cmd_eval)

    p = subparsers.add_parser(
        "compare",
        help="print the ECP-vs-CONCAT and per-pairing comparison of a run",
        description="Print the comparison tables from RUN_DIR/eval/metrics.json, "
        "computing it first when missing (or with --recompute).",
    )
    _add_eval_options(p)
    p.add_argument("--recompute", action="store_true", help="re-run the evaluation first")
    p.set_defaults(func=cmd_compare)

    p = subparsers.add_parser(
        "import",
        help="convert a SPASM release, ShareGPT or OpenAI messages file into a run directory",
        description="Convert the public SPASM release JSONL, or people's conversations with a "
        "model (ShareGPT JSON/JSONL, OpenAI messages JSONL: a run with human seats), into "
        "personas/dialogues/turns Parquet tables that `spasm eval` reads (and takes as --reference).",
    )
    p.add_argument("file", metavar="FILE", help="the .jsonl (or ShareGPT .json) file")
    p.add_argument("--format", metavar="FORMAT", default="auto",
                   help="auto (default: told by the first record), spasm, sharegpt, openai, "
                   "otlp (OpenTelemetry GenAI spans, OTLP JSON) or langfuse (a Langfuse export)")
    p.add_argument("--out", metavar="DIR", required=True, help="run directory to create")
    p.add_argument(
        "--condition",
        metavar="CONDITION",
        default="ecp",
        help="condition for records without one: ecp (default), concat, quoted or a plugin's",
    )
    p.add_argument(
        "--pairing",
        metavar="LABEL",
        default=None,
        help="pairing label for records without one (e.g. gpt/deepseek; default unknown, and "
        "human×<model> for people's conversations)",
    )
    p.add_argument("--force", action="store_true", help="replace tables already in --out")
    p.set_defaults(func=cmd_import)


def _require_extras() -> None:
    """Turn a missing optional dependency into a UserError that says what to install."""
    try:
        import matplotlib  # noqa: F401
        import numpy  # noqa: F401
        import scipy  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError as exc:
        raise UserError(
            f"Evaluation needs the 'eval' extra ({exc.name} is missing): pip install 'spasm[eval]'."
        ) from exc


def _key_env(value: str) -> str | None:
    return None if value.strip().lower() in ("none", "") else value


def _llm_choice(args: argparse.Namespace) -> tuple[str | None, BackendConfig | None]:
    """The probe/judge backend the flags ask for: a name, an endpoint config, or neither."""
    from pydantic import ValidationError

    from spasm.config import BackendConfig, format_validation_error

    endpoint = args.llm_model is not None or args.llm_base_url is not None
    if not (args.mode == "probe" or args.judge or args.consistency or args.judge_backend
            or args.simulator_errors):
        if endpoint or args.llm_backend is not None:
            raise UserError(
                "The --llm-* options choose the LLM of --mode probe, --judge, --consistency and "
                "--simulator-errors; "
                "add one of those."
            )
        return None, None
    if args.llm_max_tokens < 1:
        raise UserError("--llm-max-tokens must be at least 1.")
    if not endpoint:
        return args.llm_backend, None
    if args.llm_backend is not None:
        raise UserError(
            "--llm-backend picks a backend of the run; --llm-model/--llm-base-url describe another "
            "endpoint. Use one or the other."
        )
    if not args.llm_model:
        raise UserError("--llm-base-url needs --llm-model (the model name that endpoint serves).")
    try:
        config = BackendConfig(
            kind="openai",
            base_url=args.llm_base_url or OPENAI_BASE_URL,
            model=args.llm_model,
            api_key_env=_key_env(args.llm_api_key_env),
        )
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, "--llm-* options")) from None
    return "eval", config


def _check_args(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The checks every evaluation's flags pass; the embedder's name and options."""
    _require_extras()
    from spasm.evaluation.embeddings import available_embedders

    if args.mode not in ("cheap", "probe"):
        raise UserError(f"--mode must be cheap or probe, not {args.mode!r}.")
    if args.retrieval not in ("card", "centroid"):
        raise UserError(f"--retrieval must be card or centroid, not {args.retrieval!r}.")
    if args.embedder not in available_embedders():
        raise UserError(
            f"--embedder must be one of {', '.join(available_embedders())}, not {args.embedder!r}."
        )
    if args.concurrency < 1:
        raise UserError("--concurrency must be at least 1.")
    if args.own_ngram < 2 or args.own_min_words < 1:
        raise UserError("--own-ngram must be at least 2 and --own-min-words at least 1.")
    if args.own_consistency and not args.consistency:
        raise UserError("--own-consistency judges prompt-to-line on own content; add --consistency.")
    if not Path(args.run_dir).is_dir():
        raise UserError(f"Run directory {args.run_dir} does not exist.")
    if args.reference is not None and not Path(args.reference).is_dir():
        raise UserError(
            f"--reference {args.reference} does not exist; give a run directory or a dataset "
            "imported with `spasm import`."
        )
    device = getattr(args, "device", "cpu")
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda, not {device!r}.")
    if device != "cpu" and args.embedder not in ("local", "sentence-transformers"):
        raise UserError(
            f"--device {device} applies to --embedder local and sentence-transformers, "
            f"not {args.embedder}."
        )
    options: dict[str, Any] = {}
    if args.embedder == "openai":
        options = {
            "base_url": args.embedding_base_url,
            "api_key_env": _key_env(args.embedding_api_key_env),
        }
        if args.embedding_model:
            options["model"] = args.embedding_model
    elif args.embedder == "sentence-transformers" and args.embedding_model:
        options = {"model": args.embedding_model}
    if device != "cpu" and getattr(args, "ray", None) is not None:
        raise UserError("--device cuda is not available with --ray yet: the workers embed on CPUs.")
    if device != "cpu":  # the CPU is every embedder's default: no option for it
        options["device"] = device
    return args.embedder, options


def _evaluate(args: argparse.Namespace, out: str | None) -> Any:
    _, options = _check_args(args)
    llm_backend, llm_config = _llm_choice(args)
    ray_address = getattr(args, "ray", None)
    if ray_address is None:
        return _run_evaluate(args, out, args.embedder, options, llm_backend, llm_config)
    from spasm.evaluation.distributed import RayEmbedder, RayStages
    from spasm.raycluster import ray_session

    with ray_session(ray_address or None) as ray:
        embedder = RayEmbedder(ray, args.embedder, options)
        stages = RayStages(embedder, show=not args.no_progress and sys.stderr.isatty())
        print(f"Embedding on Ray: {embedder.workers} workers; realism, language, echoing and "
              f"the echoing judge in {stages.workers} shards of the dialogues.", file=sys.stderr)
        return _run_evaluate(args, out, embedder, {}, llm_backend, llm_config, stages)


def _run_evaluate(
    args: argparse.Namespace, out: str | None, embedder: Any, options: dict[str, Any],
    llm_backend: str | None, llm_config: BackendConfig | None, stages: Any = None,
) -> Any:
    from spasm.evaluation.pipeline import evaluate

    return evaluate(
        args.run_dir,
        embedder=embedder,
        embedder_options=options,
        mode=args.mode,
        judge=args.judge,
        consistency=args.consistency,
        simulator_errors=args.simulator_errors,
        judges=list(args.judge_backend),
        llm_backend=llm_backend,
        llm_config=llm_config,
        llm_max_tokens=args.llm_max_tokens,
        retrieval=args.retrieval,
        reference=args.reference,
        baseline=args.baseline,
        own_ngram=args.own_ngram,
        own_min_words=args.own_min_words,
        own_consistency=args.own_consistency,
        out_dir=out,
        concurrency=args.concurrency,
        progress=False if args.no_progress else None,
        overwrite=getattr(args, "overwrite", False),
        distributed=stages,
    )


def _dry_run(args: argparse.Namespace) -> int:
    """``spasm eval --dry-run``: the embedding work and its expected time; nothing written."""
    from spasm.evaluation.owncontent import OwnRule
    from spasm.evaluation.plan import eval_plan, plan_text

    embedder, options = _check_args(args)
    _llm_choice(args)  # the same flag checks as a real run
    cpus: float | None = None
    if args.ray is not None:  # the cluster's CPUs; each worker's rate is measured here, 1 thread
        from spasm.raycluster import ray_session

        with ray_session(args.ray or None) as ray:
            cpus = float(ray.cluster_resources().get("CPU", 1))
        if embedder in ("local", "static"):
            options = {**options, "threads": 1}
    plan = eval_plan(
        args.run_dir, embedder=embedder, embedder_options=options, mode=args.mode,
        retrieval=args.retrieval, own_rule=OwnRule(ngram=args.own_ngram, min_words=args.own_min_words),
    )
    sys.stdout.write(plan_text(plan))
    if cpus is not None:
        workers = max(1, int(cpus))
        rate = plan.rate
        seconds = plan.expected_seconds if rate is None else plan.to_embed / (rate * workers)
        print(f"On the Ray cluster: {cpus:g} CPUs, {workers} workers of one thread; at the rate "
              f"above each (one thread, measured here: the workers' CPUs taken as fast as this "
              f"machine's): {_duration(seconds or 0.0)}.")
    return 0


def _duration(seconds: float) -> str:
    from spasm.evaluation.plan import duration

    return duration(seconds)


def cmd_eval(args: argparse.Namespace) -> int:
    """``spasm eval``: evaluate and write metrics.json, per_dialogue.parquet, report.html."""
    from spasm.evaluation.pipeline import EVAL_DIRNAME

    if getattr(args, "dry_run", False):
        return _dry_run(args)
    metrics = _evaluate(args, args.out)
    out = Path(args.out) if args.out else Path(args.run_dir) / EVAL_DIRNAME
    c = metrics.counts
    print(
        f"Evaluated {c.dialogues_ok} dialogues ({c.utterances} utterances; "
        f"{c.texts_embedded} texts embedded, {c.texts_cached} from cache) in "
        f"{metrics.timings.get('total', 0):.1f} s."
    )
    o = metrics.echoing.overall
    if o.rate is not None:
        print(f"Echoing ({metrics.echoing.method}): {o.n_echoing}/{o.n} = {o.rate:.1%}")
    own = metrics.own_content
    every = next((st for st in own.stats if st.condition == "all"), None) if own is not None else None
    if own is not None and every is not None and every.copied_share is not None:
        print(f"Own content: {every.copied_share:.1%} of the Client's words copied (runs of {own.ngram}+ "
              f"words said earlier), {every.left_out} of {every.utterances} Client utterances left out; "
              "drift and separability on own content beside the raw ones (spasm compare)")
    if metrics.goals is not None:  # a run with scenarios: goal success per condition
        for r in metrics.goals.rates:
            if r.pairing == "all" and r.scenario_id == "all" and r.rate is not None:
                print(f"Goal met ({r.condition}): {r.n_met}/{r.n} = {r.rate:.1%} "
                      f"[95% CI {r.ci_low or 0:.2f}, {r.ci_high or 0:.2f}]")
    if metrics.reliability is not None:  # a run with trials: pass^k per condition
        for row in metrics.reliability.rows:
            if row.pairing == "all" and row.scenario_id == "all":
                ks = " ".join(f"pass^{p.k} {p.unbiased:.2f}" for p in row.pass_hat
                              if p.unbiased is not None)
                floor = row.pass_hat[0].noise_floor if row.pass_hat else None
                print(f"Reliability ({row.condition}, {row.tasks} tasks): {ks or 'no outcome'}"
                      + (f"; noise floor {floor:.3f}" if floor is not None else "")
                      + (f"; {row.flip_share:.0%} of tasks flip" if row.flip_share is not None
                         else ""))
    if metrics.payload_leak is not None:  # a run with tools: the Client repeats hidden payloads
        for r in metrics.payload_leak.rates:
            if r.pairing == "all" and r.condition != "all" and r.rate is not None:
                print(f"Payload leaks ({r.condition}): {r.n_leaking}/{r.n} = {r.rate:.1%}")
    if metrics.human is not None:  # people in seats: simulator vs people, the judge vs the person
        from spasm.evaluation.human import summary_lines

        for line in summary_lines(metrics.human):
            print(line)
    if metrics.group is not None:  # a group run: role confusion per condition
        from spasm.evaluation.compare import group_text

        print(group_text(metrics.group).lstrip("\n"))
    if metrics.llm is not None:
        u, d, e = metrics.llm, metrics.drift, metrics.echoing
        print(
            f"LLM {u.backend} ({u.model}): {u.calls} calls, {u.cache_hits} from cache, "
            f"{u.prompt_tokens + u.completion_tokens} tokens, cost {u.cost:.4f}; logged in "
            f"{Path(args.run_dir) / 'calls.parquet'}"
        )
        if metrics.mode == "probe":
            print(f"Probe fallbacks: {d.probe_fallbacks} of {metrics.counts.client_turns} client turns")
        if metrics.judge:
            print(f"Judge fallbacks: {e.judge_fallbacks} of {metrics.counts.dialogues_ok} dialogues")
        if metrics.consistency is not None:
            by = {(s.measure, s.pairing): s for s in metrics.consistency.stats}
            parts = [
                f"{'Q&A' if m == 'qa' else m.replace('_', '-')} {by[(m, 'all')].mean:.2f}"
                for m in ("prompt_to_line", "line_to_line", "qa")
                if (m, "all") in by and by[(m, "all")].mean is not None
            ]
            print(f"Persona consistency: {', '.join(parts) or 'no score'} "
                  f"({metrics.consistency.fallbacks} fallbacks)")
        if metrics.simulator_errors is not None:
            for r in metrics.simulator_errors.rates:
                if r.pairing == "all" and r.failed_critical_share is not None:
                    print(f"Failed dialogues with a critical simulator error ({r.condition}): "
                          f"{r.failed_critical}/{r.failed} = {r.failed_critical_share:.1%}")
        if metrics.judges is not None:
            for a in metrics.judges.agreement:
                kappa = "—" if a.kappa is None else f"{a.kappa:.2f}"
                print(f"Judges on {a.metric}: Fleiss' kappa {kappa}, {a.n_disagreements} of "
                      f"{a.n_items} items disagree")
            for w in metrics.judges.warnings:
                print(f"Warning: {w}", file=sys.stderr)
    print(f"Wrote {out / 'metrics.json'}")
    print(f"Wrote {out / 'compare.json'}")
    print(f"Wrote {out / 'report.html'}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """``spasm compare``: print the comparison tables (evaluating first when needed) and
    write ``compare.json``: every metric per condition, paired against the baseline."""
    from spasm.evaluation.compare import comparison_text, write_comparison
    from spasm.evaluation.pipeline import (
        COMPARE_FILE,
        EVAL_DIRNAME,
        METRICS_FILE,
        comparison_for,
        load_metrics,
    )

    eval_dir = Path(args.run_dir) / EVAL_DIRNAME
    path = eval_dir / METRICS_FILE
    fresh = args.recompute or not path.is_file()
    if not fresh and args.reference is not None:
        fresh = True  # z-scores against a new reference need the realism stage again
    metrics = _evaluate(args, None) if fresh else load_metrics(path)
    comparison = comparison_for(eval_dir, metrics, baseline=args.baseline)
    write_comparison(comparison, eval_dir / COMPARE_FILE)
    sys.stdout.write(comparison_text(metrics, comparison))
    if metrics.human is not None:  # people in seats: simulator vs people, the judge vs the person
        from spasm.evaluation.human import summary_lines

        print("\n".join(summary_lines(metrics.human)))
    print(f"Wrote {eval_dir / COMPARE_FILE}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """``spasm import``: convert a SPASM release, ShareGPT or OpenAI messages file into run tables."""
    from spasm.dataset.importer import import_conversations

    summary = import_conversations(
        args.file, args.out, fmt=args.format, condition=args.condition, pairing=args.pairing,
        overwrite=args.force,
    )
    counts = summary["counts"]
    people = summary.get("format") in ("sharegpt", "openai", "otlp", "langfuse")
    print(
        f"Imported {counts['dialogues']} dialogues, {counts['personas']} "
        f"{'people (pseudonymous operators)' if people else 'personas'} and "
        f"{counts['turns']} turns into {args.out}. Next: spasm eval {args.out}"
    )
    left_out = dict(summary.get("left_out") or {})
    merged = left_out.pop("merged", 0)
    if left_out:  # system prompts, tool messages, empty messages, non-text parts
        print("Left out (not utterances): " + ", ".join(f"{n} {k}" for k, n in left_out.items()) + ".")
    if merged:
        print(f"{merged} message(s) joined to the one before (the same seat spoke twice in a row).")
    return 0
