"""Dry-run cost estimates (SPEC §6): calls, tokens and cost per pairing, before spending.

The prompt side is computed, not guessed: for every planned dialogue we count (tiktoken) the real
system prompts of its persona and role, and add the history each turn re-sends. What cannot be
known in advance is how long dialogues run and how long replies are. Without data we assume the
worst (every dialogue reaches the cap and every reply ``max_tokens``): an upper bound. With data
(a pilot of a few real dialogues, ``--pilot N``, or the dialogues a run already finished) we use
the observed mean length, reply size and the ratio of the API's token counts to ours.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pyarrow.compute as pc

from spasm.agents import client_system_prompt, responder_system_prompt
from spasm.config import RunConfig
from spasm.projection import Viewer
from spasm.simulation import DialogueSpec
from spasm.store import RunStore
from spasm.tokens import count_tokens

_MSG_OVERHEAD = 4


@dataclass(frozen=True)
class Calibration:
    """What a pilot (or finished dialogues) tells about the run."""

    utterances: float | None  # mean utterances per dialogue; None: the cap
    reply_tokens: float | None  # mean completion tokens per utterance; None: max_tokens
    prompt_scale: float = 1.0  # API-reported prompt tokens / our count
    dialogues: int = 0
    source: str = "upper bound: every dialogue to the cap, every reply max_tokens"


@dataclass
class PairingEstimate:
    """Estimated usage of one pairing (summed over its dialogues and conditions)."""

    pairing: str
    dialogues: int = 0
    calls: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    cost: float = 0.0

    @property
    def total_tokens(self) -> float:
        return self.prompt_tokens + self.completion_tokens


def _dialogue_usage(
    spec: DialogueSpec, config: RunConfig, utterances: int, reply: float, cache: dict[str, int]
) -> tuple[float, float, float, float, float]:
    """(client prompt, responder prompt, client completion, responder completion, judge prompt)."""

    def tokens(text: str) -> int:
        if text not in cache:
            cache[text] = count_tokens(text)
        return cache[text]

    role = config.dialogue.responder_role
    sys_c = tokens(client_system_prompt(spec.persona["card"], role))
    sys_r = tokens(responder_system_prompt(role, config.dialogue.responder_instructions))
    viewer = Viewer("client", "")
    opening = tokens(viewer.opening) + _MSG_OVERHEAD
    instruction = tokens(viewer.continue_instruction) + 12
    per_turn = reply + _MSG_OVERHEAD
    prompts = {"client": 0.0, "responder": 0.0}
    for k in range(utterances):
        speaker = "client" if k % 2 == 0 else "responder"
        system = sys_c if speaker == "client" else sys_r
        if spec.condition == "concat":
            prompts[speaker] += system + _MSG_OVERHEAD + instruction + k * (reply + 3) + 2
        else:
            extra = opening if speaker == "client" else 0
            prompts[speaker] += system + _MSG_OVERHEAD + extra + k * per_turn + 2
    judge = 0.0
    if config.termination.judge:
        first = config.termination.min_utterances
        for k in range(max(first, 2), utterances + 1, 2):
            judge += 80 + k * (reply + 3)
    n_client = (utterances + 1) // 2
    return prompts["client"], prompts["responder"], n_client * reply, (utterances // 2) * reply, judge


def estimate(
    config: RunConfig, specs: list[DialogueSpec], calibration: Calibration | None = None
) -> list[PairingEstimate]:
    """Per-pairing estimates for ``specs`` under ``calibration`` (upper bound by default)."""
    cal = calibration or Calibration(None, None)
    cap = 2 * config.dialogue.max_turns_per_agent
    utterances = cap if cal.utterances is None else max(2, min(cap, round(cal.utterances)))
    reply = float(config.dialogue.max_tokens if cal.reply_tokens is None else cal.reply_tokens)
    judge_calls = (
        len(range(max(config.termination.min_utterances, 2), utterances + 1, 2))
        if config.termination.judge
        else 0
    )
    out: dict[str, PairingEstimate] = defaultdict(lambda: PairingEstimate(""))
    cache: dict[str, int] = {}
    for spec in specs:
        est = out[spec.pairing.label]
        est.pairing = spec.pairing.label
        pc_, pr, cc, cr, pj = _dialogue_usage(spec, config, utterances, reply, cache)
        pc_, pr, pj = pc_ * cal.prompt_scale, pr * cal.prompt_scale, pj * cal.prompt_scale
        est.dialogues += 1
        est.calls += utterances + judge_calls
        judge_completion = judge_calls * 30.0
        est.prompt_tokens += pc_ + pr + pj
        est.completion_tokens += cc + cr + judge_completion
        client_price = config.backends[spec.pairing.client].prices
        responder_price = config.backends[spec.pairing.responder].prices
        judge_backend = config.termination.judge_backend or spec.pairing.client
        judge_price = config.backends[judge_backend].prices
        est.cost += (
            pc_ * client_price.input_per_1m + cc * client_price.output_per_1m
            + pr * responder_price.input_per_1m + cr * responder_price.output_per_1m
            + pj * judge_price.input_per_1m + judge_completion * judge_price.output_per_1m
        ) / 1e6
    return list(out.values())


def calibrate(store: RunStore, config: RunConfig, specs: list[DialogueSpec]) -> Calibration | None:
    """Learn length, reply size and token-count ratio from the run's finished dialogues."""
    dialogues = store.read("dialogues")
    turns = store.read("turns", columns=["dialogue_id", "n_tokens"])
    if dialogues is None or turns is None or dialogues.num_rows == 0:
        return None
    dialogues = dialogues.filter(pc.equal(dialogues.column("status"), "ok"))
    rows = dialogues.to_pylist()
    if not rows:
        return None
    mean_utt = sum(r["n_utterances"] for r in rows) / len(rows)
    mean_reply = pc.mean(turns.column("n_tokens")).as_py() or 0.0
    by_id = {s.dialogue_id: s for s in specs}
    predicted = actual = 0.0
    cache: dict[str, int] = {}
    for r in rows:
        spec = by_id.get(r["dialogue_id"])
        if spec is None:
            continue
        pc_, pr, _, _, pj = _dialogue_usage(spec, config, r["n_utterances"], mean_reply, cache)
        predicted += pc_ + pr + pj
        actual += r["prompt_tokens"]
    scale = actual / predicted if predicted else 1.0
    return Calibration(
        mean_utt, mean_reply, scale, len(rows),
        f"calibrated on {len(rows)} finished dialogue(s): {mean_utt:.1f} utterances, "
        f"{mean_reply:.1f} tokens per reply, prompt-count ratio {scale:.2f}",
    )


def format_estimates(estimates: list[PairingEstimate], calibration: Calibration | None) -> str:
    """A table for the terminal."""
    cal = calibration or Calibration(None, None)
    lines = [
        f"Dry run ({cal.source}):",
        f"{'pairing':<28}{'dialogues':>10}{'calls':>10}{'prompt tok':>14}{'compl. tok':>12}"
        f"{'cost':>12}",
    ]
    total = PairingEstimate("TOTAL")
    for e in estimates:
        lines.append(
            f"{e.pairing:<28}{e.dialogues:>10}{e.calls:>10,.0f}{e.prompt_tokens:>14,.0f}"
            f"{e.completion_tokens:>12,.0f}{e.cost:>12.4f}"
        )
        total.dialogues += e.dialogues
        total.calls += e.calls
        total.prompt_tokens += e.prompt_tokens
        total.completion_tokens += e.completion_tokens
        total.cost += e.cost
    lines.append(
        f"{'TOTAL':<28}{total.dialogues:>10}{total.calls:>10,.0f}{total.prompt_tokens:>14,.0f}"
        f"{total.completion_tokens:>12,.0f}{total.cost:>12.4f}"
    )
    return "\n".join(lines)
