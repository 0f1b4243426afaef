"""Trainer configs written beside the data, so trainers load an export without hand edits.

* **LLaMA-Factory** reads ``dataset_info.json`` from its ``--dataset_dir``: one entry per
  format and split (``spasm_{format}_{split}``), all in its ``sharegpt`` formatting with the
  column and tags of the file (``from``/``value``/``human``/``gpt`` for ShareGPT,
  ``role``/``content``/``user``/``assistant`` for the OpenAI JSONL and the Parquet).
  LLaMA-Factory reads no per-message weight: with weights, only the ShareGPT entries (cut
  before untrained turns) are listed when ShareGPT is written.
* **axolotl** takes a ``datasets:`` block (and ``test_datasets:`` for the validation split),
  ``type: chat_template`` with the field and role mappings of one format (openai first, then
  sharegpt, then hf); with weights, ``message_field_training: weight`` on the OpenAI and
  Parquet files so that a turn with weight 0 is not trained. The card shows the block.

Each takes the files as written (:data:`DataFiles`): the data files the card's ``configs:``
block names carry a digest of their content in their name (:func:`format_path`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spasm.export.formats import ExportFormat
from spasm.export.messages import ExampleMessage
from spasm.export.tooluse import SHAREGPT_TOOL_TAGS

__all__ = ["AXOLOTL_PREFERENCE", "DataFiles", "axolotl_datasets", "format_path", "llamafactory_dataset_info",
           "llamafactory_keeps"]

FORMAT_PATHS = {"jsonl": "{name}/{split}{digest}.jsonl",
                "parquet": "data/{split}-00000-of-00001{digest}.parquet"}
#: Every data file written: (format name, split) → its path in the output directory.
DataFiles = Mapping[tuple[str, str], str]
#: The format an axolotl block reads, in order of preference.
AXOLOTL_PREFERENCE = ("openai", "sharegpt", "hf")
_TAGS = {
    "sharegpt": {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                 "system_tag": "system"},
    "role": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
             "system_tag": "system"},
}
_MESSAGES = {"sharegpt": "conversations", "openai": "messages", "hf": "messages"}


def llamafactory_keeps(messages: Sequence[ExampleMessage]) -> bool:
    """Whether LLaMA-Factory's ShareGPT reader keeps an example (its converter skips the others
    as "abnormal"): after an optional system prompt, ``user`` (or ``tool``: an observation) at
    every even position and ``assistant`` at every odd one, an even number in all."""
    body = list(messages[1:] if messages and messages[0]["role"] == "system" else messages)
    sides = (("user", "tool"), ("assistant",))
    return bool(body) and len(body) % 2 == 0 and all(
        m["role"] in sides[k % 2] for k, m in enumerate(body))


def format_path(fmt: ExportFormat, split: str, digest: str | None = None) -> str:
    """Where a format's file of ``split`` lies in the output directory: with ``digest`` (of the
    file's content) in its name, as for the files the card's ``configs:`` block names, so that
    ``datasets``, which caches a folder's configs by file name, sees a re-export."""
    return FORMAT_PATHS[fmt.layout].format(name=fmt.name, split=split, digest=f"-{digest}" if digest else "")


def _known(formats: Sequence[ExportFormat]) -> list[ExportFormat]:
    return [f for f in formats if f.name in _MESSAGES]


def llamafactory_dataset_info(
    formats: Sequence[ExportFormat], splits: Sequence[str], files: DataFiles, *, weights: bool,
    tools: bool = False,
) -> dict[str, Any]:
    """LLaMA-Factory's ``dataset_info.json`` for the files written (empty: none it can read).
    A tool export (``tools``) lists only the ShareGPT files, whose ``function_call`` and
    ``observation`` turns and ``tools`` column it names (LLaMA-Factory reads no OpenAI
    ``tool_calls``)."""
    known = _known(formats)
    if (weights or tools) and any(f.name == "sharegpt" for f in known):
        known = [f for f in known if f.name == "sharegpt"]
    elif tools or weights:
        # LLaMA-Factory reads no per-message weight: it would train the weight-0 turns of the
        # OpenAI and Parquet files, so it is offered none of them.
        known = []
    info: dict[str, Any] = {}
    for fmt in known:
        for split in splits:
            entry: dict[str, Any] = {
                "file_name": files[fmt.name, split],
                "formatting": "sharegpt",
                "columns": {"messages": _MESSAGES[fmt.name]},
                "tags": dict(_TAGS["sharegpt" if fmt.name == "sharegpt" else "role"]),
            }
            if tools:
                entry["columns"]["tools"] = "tools"
                entry["tags"].update(SHAREGPT_TOOL_TAGS)
            info[f"spasm_{fmt.name}_{split}"] = entry
    return info


def _axolotl_entry(fmt: ExportFormat, rel: str, base: str, *, hub: bool, weights: bool) -> dict[str, Any]:
    sharegpt = fmt.name == "sharegpt"
    tags = _TAGS["sharegpt" if sharegpt else "role"]
    # A local file is loaded as ``load_dataset(ds_type, data_files=path)``; a Hub repo as
    # ``load_dataset(repo, data_files=...)``. The split of a JSON/Parquet file is ``train``.
    where = {"path": base, "data_files": [rel]} if hub else {"path": f"{base.rstrip('/')}/{rel}"}
    entry: dict[str, Any] = {
        **where,
        "ds_type": "json" if fmt.layout == "jsonl" else "parquet",
        "split": "train",
        "type": "chat_template",
        "field_messages": _MESSAGES[fmt.name],
        "message_property_mappings": {"role": tags["role_tag"], "content": tags["content_tag"]},
        "roles": {"system": [tags["system_tag"]], "user": [tags["user_tag"]],
                  "assistant": [tags["assistant_tag"]]},
        "roles_to_train": ["assistant"],
        "train_on_eos": "turn",
    }
    if weights and not sharegpt:
        entry["message_field_training"] = "weight"
    return entry


def axolotl_datasets(
    formats: Sequence[ExportFormat], splits: Sequence[str], files: DataFiles, base: str, *, hub: bool = False,
    weights: bool,
) -> dict[str, Any]:
    """axolotl's ``datasets:`` (train) and ``test_datasets:`` (validation) for one format, its
    files under ``base``: the output directory as given, or with ``hub`` a Hub repo id. Empty
    when no format axolotl reads was written."""
    by_name = {f.name: f for f in _known(formats)}
    fmt = next((by_name[n] for n in AXOLOTL_PREFERENCE if n in by_name), None)
    if fmt is None:
        return {}
    out: dict[str, Any] = {}
    for key, split in (("datasets", "train"), ("test_datasets", "validation")):
        if split in splits:
            out[key] = [_axolotl_entry(fmt, files[fmt.name, split], base, hub=hub, weights=weights)]
    return out
