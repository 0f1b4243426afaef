"""Ψ is a pure function: ECP mirror images, CONCAT shared transcript, content untouched."""

from __future__ import annotations

import pytest

from spasm.errors import ConfigError
from spasm.history import History
from spasm.projection import Viewer, concat, ecp, get_projection, project, register_projection

H = (
    History()
    .append("client", "Hi, my washing machine broke.")
    .append("responder", "Sorry to hear that. When did you buy it?")
    .append("client", "Last March: is it still under warranty?")
    .append("responder", "Yes, the warranty lasts two years.")
)
CLIENT = Viewer("client", "You are Ana.")
RESPONDER = Viewer("responder", "You are an agent.")


def test_ecp_own_turns_are_assistant_partner_turns_user() -> None:
    for viewer in (CLIENT, RESPONDER):
        msgs = ecp(H, viewer)
        assert msgs[0] == {"role": "system", "content": viewer.system_prompt}
        turns = [m for m in msgs[1:] if m["content"] != viewer.opening]
        assert [m["content"] for m in turns] == [u.content for u in H]
        for m, u in zip(turns, H, strict=True):
            assert m["role"] == ("assistant" if u.speaker == viewer.speaker else "user")


def test_ecp_framings_are_mirror_images() -> None:
    client_turns = ecp(H, CLIENT)[2:]  # system + opening instruction
    responder_turns = ecp(H, RESPONDER)[1:]
    assert [m["content"] for m in client_turns] == [m["content"] for m in responder_turns]
    flip = {"user": "assistant", "assistant": "user"}
    assert [flip[m["role"]] for m in client_turns] == [m["role"] for m in responder_turns]


def test_ecp_opening_for_the_first_speaker_only() -> None:
    assert ecp(History(), CLIENT)[-1] == {"role": "user", "content": CLIENT.opening}
    assert ecp(H, RESPONDER)[1]["role"] == "user"
    assert ecp(H, RESPONDER)[1]["content"] == H[0].content


def test_concat_same_transcript_for_both_viewers() -> None:
    c, r = concat(H, CLIENT), concat(H, RESPONDER)
    assert [m["role"] for m in c] == [m["role"] for m in r] == ["system", "user"]
    transcript_c = c[1]["content"].split("\n\n")[0]
    transcript_r = r[1]["content"].split("\n\n")[0]
    assert transcript_c == transcript_r
    for u in H:
        label = "Client" if u.speaker == "client" else "Responder"
        assert f"{label}: {u.content}" in transcript_c
    assert "as the Client" in c[1]["content"] and "as the Responder" in r[1]["content"]


def test_projection_is_pure() -> None:
    before = list(H)
    assert project(H, CLIENT, "ecp") == project(H, CLIENT, "ecp")
    assert list(H) == before


def test_registry_by_name_and_unknown_names() -> None:
    assert get_projection("ecp") is ecp
    assert get_projection("concat") is concat

    @register_projection("reversed-test")
    def reversed_view(history: History, viewer: Viewer) -> list:  # type: ignore[type-arg]
        return list(reversed(ecp(history, viewer)))

    assert project(H, CLIENT, "reversed-test")[-1]["role"] == "system"
    with pytest.raises(ConfigError, match="Unknown condition"):
        get_projection("nope")
