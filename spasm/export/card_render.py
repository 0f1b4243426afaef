"""The dataset card's Markdown, from :class:`~spasm.export.card.CardStats` (numbers) only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from spasm.export.card import CardStats, GroupStats, MaskStats, size_category
from spasm.export.formats import GROUP_META_COLUMNS, META_COLUMNS
from spasm.export.scans import PLACEHOLDERS

__all__ = ["render_card"]

_ROLE_TEXT = {
    "responder": "the **Responder's** perspective: the Responder's turns are `assistant` messages and the "
    "simulated Client's are `user` messages, after the Responder's system prompt. It trains an "
    "assistant for the Responder's role.",
    "client": "the **Client's** perspective: the persona's turns are `assistant` messages and the "
    "Responder's are `user` messages, after the Client's system prompt (the persona card and its "
    "instructions). It trains a user simulator.",
    "both": "**both** perspectives: every conversation appears twice, once per role (column `role`); "
    "the role's own turns are `assistant` messages, its partner's `user` messages, after its own "
    "system prompt.",
}


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    if not rows:
        return ["(none)", ""]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return [*lines, ""]


def _n(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _pairs(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {_n(v)}" for k, v in counts.items())


def _header(stats: CardStats, configs: list[dict[str, Any]] | None) -> str:
    data: dict[str, Any] = {
        "license": stats.license,
        "language": [stats.language],
        "task_categories": ["text-generation"],
        "tags": ["synthetic", "dialogue", "multi-turn", "persona", "user-simulation", "spasm"],
        "size_categories": [size_category(stats.examples)],
        "pretty_name": stats.title,
    }
    if configs:
        data["configs"] = configs
    return "---\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True) + "---\n"


def _overview(s: CardStats) -> list[str]:
    lines = [f"# {s.title}", "",
             f"Synthetic multi-turn conversations between a persona-driven simulated **Client** and a "
             f"**Responder**, generated with spasm from the run `{s.run}`. Every "
             "number on this card is computed from the run's tables.", ""]
    if s.group is not None:
        lines += _group(s.group, s.examples)
    elif s.role:
        lines += [f"This export takes {_ROLE_TEXT[s.role]}", ""]
    if s.formats:
        named = s.group is not None and "name_field" in s.group.speaker_names
        columns = [*META_COLUMNS, *(GROUP_META_COLUMNS if s.group is not None else ())]
        lines += ["Formats: " + ", ".join(f"`{f}`" for f in s.formats) + ". The `hf` files have a "
                  f"`messages` column (`[{{role, content{', name' if named else ''}}}]`, the layout chat "
                  "templates and TRL's SFTTrainer take) and the metadata columns "
                  + ", ".join(f"`{c}`" for c in columns) + ".", ""]
    return lines


_NAMES_TEXT = {
    "prefix": "the speaker's id as a prefix of the content (`Ana: …`)",
    "name_field": "the speaker's id in the message's `name` field when it is a lone turn (ShareGPT, which "
    "has no such field, writes it as a prefix; merged turns carry the prefix)",
}


def _group(g: GroupStats, examples: int) -> list[str]:
    seats = ", ".join(f"`{p}` ({g.roles[p]})" for p in g.participants)
    lines = [f"This is a group conversation export: each example is one conversation from one "
             f"participant's own frame (its ECP projection, whatever the run's condition), for {seats} "
             "(column `participant_id`, its role in `role`). The participant's turns are `assistant` "
             "messages and every other participant's turn is a `user` message carrying "
             + " or ".join(_NAMES_TEXT.get(n, n) for n in g.speaker_names) + "; every example ends on "
             "a turn of its participant."]
    if g.silent_seats:
        lines[0] += (f" {_n(g.silent_seats)} exported seats never spoke in their conversation and have "
                     "no example.")
    alternation = ("The turns of the other participants between two of the participant's own are one "
                   f"`user` message, each turn a paragraph with its speaker's `Name: ` prefix "
                   f"({_n(g.merged_turns)} turns merged into the message before them), so roles "
                   "alternate `user`/`assistant` after the system prompt, as LLaMA-Factory's ShareGPT "
                   "reader and the chat templates of Llama 2, Mistral and Gemma require.")
    if g.openings_added:
        alternation += (f" {_n(g.openings_added)} examples whose frame opened on the participant's own "
                        "turn start with the instruction to open.")
    kept = (f" LLaMA-Factory keeps {'all' if g.llamafactory_kept == examples else ''} "
            f"{_n(g.llamafactory_kept)} of the {_n(examples)} examples").replace("  ", " ")
    if g.llamafactory_kept < examples:
        kept += (f": it skips {'the other ' if g.llamafactory_kept else ''}"
                 f"{_n(examples - g.llamafactory_kept)}, whose roles do not "
                 "alternate or whose message count after the system prompt is odd (an example that "
                 "ends on a `user` message: `--ending keep`), and so do those chat templates.")
    else:
        kept += "; axolotl (`chat_template`) and TRL's SFTTrainer read every example."
    return [*lines, "", alternation + kept, ""]


def _statistics(s: CardStats) -> list[str]:
    lengths = s.utterances_per_conversation
    lines = ["## Statistics", ""]
    lines += _table(["what", "count"], [
        ("personas", _n(s.personas)), ("conversations", _n(s.conversations)),
        ("examples", _n(s.examples)), ("utterances", _n(s.utterances)), ("words", _n(s.words)),
        ("prompt tokens (API-reported)", _n(s.prompt_tokens)),
        ("completion tokens (API-reported)", _n(s.completion_tokens)),
    ])
    lines += [f"Utterances per conversation: min {lengths.min}, median {_n(lengths.median)}, "
              f"mean {lengths.mean:.2f}, max {lengths.max}.", ""]
    if s.splits:
        how = ("Split by persona (seeded): no persona appears in two splits." if s.group is None else
               "Split by the first client seat's persona (seeded): that seat's persona never appears "
               "in two splits, and every condition of a group stays in one split; the other client "
               "seats are drawn from the same persona pool, so their personas can appear in more "
               "than one split.")
        lines += ["### Splits", "", how, ""]
        lines += _table(["split", "personas", "conversations", "examples"],
                        [(k, _n(v.personas), _n(v.conversations), _n(v.examples))
                         for k, v in s.splits.items()])
    lines += ["### Coverage of the persona schema", ""]
    lines += _table(["field", "values present", "of the schema's pool", "values outside the pool"],
                    [(c.field, c.present, c.pool if c.pool is not None else "n/a", c.outside_pool)
                     for c in s.coverage])
    return lines


def _generation(s: CardStats) -> list[str]:
    lines = ["## Generation", ""]
    lines += _table(["pairing", "client model", "responder model", "conversations"],
                    [(m["pairing"], m["client_model"], m["responder_model"], _n(m["conversations"]))
                     for m in s.models])
    if s.temperatures:
        lines += _table(["pairing", "client temperature", "responder temperature"],
                        [(p, t["client"], t["responder"]) for p, t in s.temperatures.items()])
    lines += [f"- T_max (turns per agent): {s.t_max if s.t_max is not None else 'not recorded'}",
              f"- run seed: {s.seed if s.seed is not None else 'not recorded'}; distinct dialogue seeds: "
              f"{s.dialogue_seeds}",
              "- conditions (history projection): " + _pairs(s.conditions),
              "- harness levels: " + _pairs(s.harness_levels), ""]
    lines += ["### Termination reasons", ""]
    lines += _table(["reason", "conversations"], [(k, _n(v)) for k, v in s.terminations.items()])
    return lines


def _quality(s: CardStats) -> list[str]:
    lines = ["## Quality checks", ""]
    if s.qa is None:
        return [*lines, "No QA scan has been run (`spasm qa RUN_DIR`).", ""]
    qa = s.qa
    lines += [f"`spasm qa` scanned {_n(qa.dialogues)} conversations ({_n(qa.turns)} utterances) of the run "
              "for AI-identity leakage, system-prompt leakage, contact-like strings, empty turns, broken "
              "alternation, exact and near duplicates and role flips.", ""]
    if qa.findings:
        lines += _table(["finding", "findings", "conversations"],
                        [(k, _n(n), _n(qa.dialogues_with.get(k, 0))) for k, n in sorted(qa.findings.items())])
    else:
        lines += ["No findings.", ""]
    lines += [f"- near duplicates: {qa.near_duplicates}", f"- role flips: {qa.role_flips}",
              *([f"- languages: {qa.languages}"] if qa.languages else []), ""]
    if s.role is not None:
        lines += ["Redactions in this export (contact-like strings replaced by typed placeholders):", ""]
        lines += _table(["placeholder", "replaced"],
                        [(PLACEHOLDERS[k], _n(s.redactions.get(k, 0))) for k in PLACEHOLDERS])
        dropped = sum(s.dropped.values())
        how = " (each under the first reason that applies):" if dropped else "."
        lines += [f"Dropped conversations: {_n(dropped)}{how}", ""]
        if dropped:
            lines += _table(["reason", "conversations"], [(k, _n(v)) for k, v in s.dropped.items()])
        if s.quarantined:
            lines += [f"{_n(s.quarantined)} further conversations were quarantined with an error during "
                      "generation and never completed.", ""]
        if s.dropped.get("human"):
            lines += [f"{_n(s.dropped['human'])} conversations with a person in a seat (`spasm play`) "
                      "are left out: people typed their turns (pass `--include-human` to keep them).", ""]
        if s.human_conversations:
            lines += [f"{_n(s.human_conversations)} of the conversations have a person in a seat "
                      "(`--include-human`): their turns were typed by people (pseudonymous operators, "
                      "`dialogues.operator`), not generated.", ""]
    return lines


_SYSTEM_TEXT = {
    "keep": "Each example starts with the role's system prompt as a `system` message.",
    "merge": "The role's system prompt is merged into the first `user` message (its text, a blank line, "
    "the user's text), for chat templates without a system role (`--system-prompt merge`).",
    "drop": "The system prompt is dropped (`--system-prompt drop`).",
}


def _masks(m: MaskStats, formats: Sequence[str]) -> list[str]:
    if not m.untrained_turns:
        return ["No turn of the trained role was flagged: every `assistant` turn is trained.", ""]
    head = (f"{_n(m.untrained_turns)} `assistant` turns in {_n(m.untrained_examples)} examples were flagged "
            "(the harness's checker failed twice, or a finding kept with `--allow-qa`)")
    if not m.weights:
        return [head + " and are trained like the others: export with `--weights` to mask them.", ""]
    lines = [head + " and are masked:", ""]
    if "openai" in formats:
        lines.append("- `openai`: `\"weight\": 0` on those messages, 1 on the other `assistant` messages;")
    if "hf" in formats:
        lines.append("- `hf`: `weight` in each message of `messages` (0/1 on `assistant` messages, null on "
                     "the others) and a parallel column `weights` (one per message: 1 trained, 0 not);")
    if "sharegpt" in formats:
        lines.append(f"- `sharegpt` has no per-message weight: {_n(m.sharegpt_cut)} examples are cut before "
                     f"their first flagged turn (ending on the trained turn before it) and "
                     f"{_n(m.sharegpt_dropped)} whose first turn is flagged are left out, so the ShareGPT "
                     "files have fewer turns than the others.")
    return [*lines, ""]


def _training(s: CardStats, axolotl: dict[str, Any] | None) -> list[str]:
    if s.role is None:
        return []
    lines = ["## Training", ""]
    if s.ending == "trim":
        lines += ["Every example ends on a turn of the role it trains: the partner's turns after the "
                  f"role's last one are trimmed ({_n(s.trimmed_turns)} turns), so ShareGPT examples have an "
                  "even number of messages after the system prompt, as LLaMA-Factory requires.", ""]
    elif s.ending == "keep":
        every = s.user_endings == s.examples and s.examples > 0
        lines += ["Examples keep the partner's turns after the role's last one (`--ending keep`): "
                  + ("every example" if every else f"{_n(s.user_endings)} of the {_n(s.examples)} examples")
                  + " end" + ("s" if every else "") + " on a `user` message, and LLaMA-Factory skips "
                  "examples that do (an odd number of messages after the system prompt)"
                  + (": it has nothing to train on and fails. Export with `--ending trim` for it."
                     if every else "."), ""]
    if s.system_prompt in _SYSTEM_TEXT:
        lines += [_SYSTEM_TEXT[s.system_prompt], ""]
    if s.masks is not None:
        lines += _masks(s.masks, s.formats)
    if not s.trainer_configs and s.masks is not None and s.masks.weights and \
            {"openai", "hf"} & set(s.formats):
        lines += ["**LLaMA-Factory**: no `dataset_info.json`: LLaMA-Factory reads no per-message "
                  "`weight`, so it would train the turns weighted 0 in these files. Add `--format "
                  "sharegpt` (examples cut before their first untrained turn) for it.", ""]
    if s.trainer_configs:
        lines += ["**LLaMA-Factory**: `dataset_info.json` beside the data declares "
                  + ", ".join(f"`{n}`" for n in s.trainer_configs)
                  + " (`formatting: sharegpt` with their tags): pass this folder as `dataset_dir` and a name "
                  "as `dataset` (`eval_dataset` for validation)."
                  + (" It lists the ShareGPT files only: LLaMA-Factory reads no per-message weight."
                     if s.masks is not None and s.masks.weights and "sharegpt" in s.formats
                     and len(s.formats) > 1 else ""), ""]
    if axolotl:
        lines += ["**axolotl** (`type: chat_template`):", "", "```yaml",
                  yaml.safe_dump(axolotl, sort_keys=False, allow_unicode=True).rstrip(), "```", ""]
    return lines


def _uses(s: CardStats) -> list[str]:
    small = any("smol" in str(m["client_model"]).lower() or "smol" in str(m["responder_model"]).lower()
                for m in s.models)
    lines = ["## Intended uses", "",
             "- supervised fine-tuning of an assistant in the Responder's role, or of a user simulator "
             "(the Client's role);",
             "- research on persona consistency, persona drift and echoing in LLM-LLM dialogue;",
             "- evaluation sets for multi-turn behaviour (use the persona-level splits).", "",
             "## Limitations", "",
             "- The conversations are synthetic: both sides were written by the models listed above, "
             "with their biases and errors. The personas are sampled from a schema; they are not real "
             "people, and nothing here describes a real person.",
             "- The QA scans are pattern-based: they find common forms of AI-identity and prompt leakage "
             "and of contact-like strings, not every form. Near duplicates are estimated with MinHash.",
             f"- Language: `{s.language}` as declared at export; it is not detected."]
    if small:
        lines.append("- Some conversations were generated by a very small model (SmolLM2-135M): fine for "
                     "smoke tests and plumbing, not for training or conclusions about models.")
    return [*lines, ""]


def render_card(
    stats: CardStats, *, configs: list[dict[str, Any]] | None = None, axolotl: dict[str, Any] | None = None
) -> str:
    """The card as Markdown with the Hub's YAML header (``configs`` lists the data files;
    ``axolotl`` is the ``datasets:`` block shown under Training)."""
    body = [*_overview(stats), *_statistics(stats), *_generation(stats), *_quality(stats),
            *_training(stats, axolotl), *_uses(stats),
            "## License", "",
            f"`{stats.license}`" + ("." if stats.license != "unknown" else
                                    ": no license was set; set `license` in the run config or pass "
                                    "`--license` (an id the Hub knows, e.g. `cc-by-4.0`).")]
    return _header(stats, configs) + "\n" + "\n".join(body) + "\n"
