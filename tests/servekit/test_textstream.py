from __future__ import annotations

from servekit.engine.textstream import TextStream


def feed(stream: TextStream, pieces: list[bytes]) -> list[str]:
    out = [stream.push(p) for p in pieces]
    out.append(stream.flush())
    return out


def test_plain_text_passes_through_immediately() -> None:
    s = TextStream()
    assert feed(s, [b"Hel", b"lo"]) == ["Hel", "lo", ""]


def test_multibyte_character_split_across_tokens_is_held() -> None:
    raw = "é中".encode()
    s = TextStream()
    assert [s.push(raw[:1]), s.push(raw[1:3]), s.push(raw[3:])] == ["", "é", "中"]


def test_stop_sequence_across_tokens_is_cut_and_not_emitted() -> None:
    s = TextStream(["END"])
    out = [s.push(b"abc E"), s.push(b"N"), s.push(b"Dxyz")]
    assert out == ["abc ", "", ""]
    assert s.stopped
    assert s.text == "abc "
    assert s.flush() == ""


def test_false_alarm_prefix_is_released() -> None:
    s = TextStream(["END"])
    assert s.push(b"E") == ""
    assert s.push(b"x") == "Ex"
    assert not s.stopped


def test_earliest_of_several_stops_wins() -> None:
    s = TextStream(["zz", "b"])
    assert s.push(b"azzb") == "a"


def test_flush_releases_held_prefix_at_end() -> None:
    s = TextStream(["END"])
    assert s.push(b"xEN") == "x"
    assert s.flush() == "EN"
    assert s.text == "xEN"


def test_dangling_byte_becomes_replacement_character() -> None:
    s = TextStream()
    assert s.push("中".encode()[:2]) == ""
    assert s.flush() == "\ufffd"
