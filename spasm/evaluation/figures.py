"""The eval report's figures as data: a name, a caption and a PNG, written by ``spasm eval`` to
``eval/figures.json`` beside ``report.html``.

:mod:`spasm.evaluation.report` draws them and embeds the same records in the HTML; the viewer
reads them from here instead of picking ``<img>`` tags out of the report. A leaf: it imports
no plotting library, so reading figures costs no matplotlib.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spasm.dataset.files import atomic_write_text

__all__ = ["FIGURES_FILE", "ReportFigure", "read_figures", "write_figures"]

FIGURES_FILE = "figures.json"


class ReportFigure(BaseModel):
    """One figure of the eval report."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]*$",
                      description="fixed name: drift, map, acc, echo, onset, forest, and group_rates, "
                                  "group_echo_pairs, group_drift in a run with group dialogues")
    caption: str
    png_base64: str = Field(pattern=r"^[A-Za-z0-9+/]*={0,2}$", description="the PNG, base64")

    @classmethod
    def from_png(cls, name: str, caption: str, png: bytes) -> ReportFigure:
        """A figure from the PNG's bytes."""
        return cls(name=name, caption=caption, png_base64=base64.b64encode(png).decode("ascii"))

    @property
    def png(self) -> bytes:
        """The PNG's bytes."""
        return base64.b64decode(self.png_base64)

    def data_uri(self) -> str:
        """The PNG as a ``data:`` URI (what an ``<img src>`` embeds)."""
        return f"data:image/png;base64,{self.png_base64}"


class _FiguresFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    figures: list[ReportFigure]


def write_figures(eval_dir: str | Path, figures: Sequence[ReportFigure]) -> Path:
    """Write ``figures`` atomically to ``eval_dir/figures.json``."""
    path = Path(eval_dir) / FIGURES_FILE
    atomic_write_text(path, _FiguresFile(figures=list(figures)).model_dump_json(indent=1))
    return path


def read_figures(eval_dir: str | Path) -> list[ReportFigure]:
    """The figures in ``eval_dir/figures.json``, in the report's order; none when the run was
    not evaluated (or evaluated before the figures were written as data) or the file is not
    one ``spasm eval`` wrote."""
    path = Path(eval_dir) / FIGURES_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return []
    try:
        figures = _FiguresFile.model_validate_json(text).figures
        for figure in figures:
            base64.b64decode(figure.png_base64, validate=True)
    except (ValidationError, binascii.Error):
        return []
    return figures
