"""KV and prefix caching: a cache hit never changes greedy output, and reuses what it should."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.api import Loaded, Sampling
from engine.model.kv import KVState, joined, plain
from engine.runtime.prefix_cache import PrefixCache, checksum, kv_layout
from tests.support.engine_runner import EngineRunner, done, token_ids

SYSTEM = {"role": "system", "content": "You are a careful assistant who answers in one short paragraph. " * 3}
GREEDY = Sampling(max_tokens=20)  # asked with answer_cache=False: a repeated question must reach the model


def cold(runner: EngineRunner, messages: list[dict[str, str]]) -> list[int]:
    return token_ids(runner.run(messages, sampling=GREEDY, answer_cache=False, prefix_cache=False))


def warm(runner: EngineRunner, messages: list[dict[str, str]], conversation: str):  # noqa: ANN201
    events = runner.run(messages, sampling=GREEDY, answer_cache=False, conversation_id=conversation)
    return token_ids(events), done(events)


def check_state_consistent(runner: EngineRunner) -> None:
    for key, entry in runner.engine.prefix_cache.entries.items():
        lengths = {sum(k.shape[-2] for k, _ in parts) for parts in entry.snapshot}
        lengths |= {sum(v.shape[-2] for _, v in parts) for parts in entry.snapshot}
        assert lengths == {len(entry.tokens)}, f"entry {key}: KV length {lengths} != {len(entry.tokens)} tokens"


def scenario(runner: EngineRunner, tag: str) -> None:
    # 1. shared system prompt: a second conversation reuses the first one's system prompt
    first = [SYSTEM, {"role": "user", "content": "Name a colour."}]
    ids, final = warm(runner, first, f"{tag}-a")
    assert ids == cold(runner, first)
    other = [SYSTEM, {"role": "user", "content": "Name an animal."}]
    ids, final = warm(runner, other, f"{tag}-b")
    assert ids == cold(runner, other)
    assert final.metrics.cached_tokens >= 20, "the shared system prompt must be reused"

    # 2. a multi-turn conversation: each turn computes only what is new
    messages = list(first)
    previous_prompt = 0
    for i, text in enumerate(["Why?", "Say it again, shorter.", "Thanks."]):
        reply = done(runner.run(messages, sampling=GREEDY, answer_cache=False, conversation_id=f"{tag}-chat")).text
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": text}]
        ids, final = warm(runner, messages, f"{tag}-chat")
        assert ids == cold(runner, messages), f"turn {i}"
        m = final.metrics
        assert m.cached_tokens + m.computed_tokens == m.prompt_tokens
        assert m.cached_tokens >= previous_prompt - 4, "history must be reused (up to re-tokenisation at the seam)"
        previous_prompt = m.prompt_tokens
        check_state_consistent(runner)

    # 3. regenerate: the very same prompt again is a full hit (one token left to compute)
    ids, final = warm(runner, messages, f"{tag}-chat")
    assert ids == cold(runner, messages)
    assert final.metrics.computed_tokens == 1

    # 4. edit an earlier turn: reuse up to the change only
    edited = [*messages[:1], {"role": "user", "content": "Name a shape."}, *messages[2:]]
    ids, final = warm(runner, edited, f"{tag}-chat")
    assert ids == cold(runner, edited)
    assert 0 < final.metrics.cached_tokens < final.metrics.prompt_tokens - 10
    check_state_consistent(runner)


def test_cache_hits_equal_cold_on_tiny_model(tiny_engine: EngineRunner) -> None:
    scenario(tiny_engine, "tiny")


@pytest.mark.bundled
def test_cache_hits_equal_cold_on_bundled_model(bundled_engine: EngineRunner) -> None:
    scenario(bundled_engine, "bundled")


def test_cache_off_computes_everything(tiny_engine: EngineRunner) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Off please."}]
    final = done(tiny_engine.run(messages, sampling=GREEDY, answer_cache=False, prefix_cache=False))
    assert final.metrics.cached_tokens == 0
    assert final.metrics.computed_tokens == final.metrics.prompt_tokens


def fake_state(tokens: list[int], layers: int = 2) -> KVState:
    snap = plain([(torch.randn(1, 2, len(tokens), 8), torch.randn(1, 2, len(tokens), 8)) for _ in range(layers)])
    return KVState.from_snapshot(snap, tokens)


def test_lookup_finds_longest_prefix_and_leaves_one_token() -> None:
    cache = PrefixCache("m")
    cache.insert("a", fake_state([1, 2, 3, 4, 5]))
    cache.insert("b", fake_state([1, 2, 9]))
    state = cache.lookup([1, 2, 3, 4, 7])
    assert state.tokens == [1, 2, 3, 4] and state.cache_length() == 4
    full = cache.lookup([1, 2, 3, 4, 5])
    assert full.tokens == [1, 2, 3, 4], "at least one prompt token must be left to compute"
    assert len(cache.lookup([8, 8])) == 0


def test_reuse_shares_tensors_and_never_mutates_an_entry() -> None:
    cache = PrefixCache("m")
    cache.insert("a", fake_state([1, 2, 3, 4]))
    before = cache.entries["a"].snapshot[0][0][0].clone()
    state = cache.lookup([1, 2, 3, 9, 9])
    layer = state.cache.layers[0]
    assert layer.keys.untyped_storage().data_ptr() == cache.entries["a"].snapshot[0][0][0].untyped_storage().data_ptr()
    layer.update(torch.ones(1, 2, 2, 8), torch.ones(1, 2, 2, 8))  # what the model does while decoding
    assert torch.equal(cache.entries["a"].snapshot[0][0][0], before)
    assert state.cache_length() == 5


def test_lru_eviction_respects_byte_budget() -> None:
    one = fake_state(list(range(100))).nbytes()
    cache = PrefixCache("m", budget_bytes=int(one * 2.5))
    for name in "abc":
        cache.insert(name, fake_state([ord(name)] + list(range(99))))
    assert list(cache.entries) == ["b", "c"]
    cache.lookup([ord("b")] + list(range(50)))  # touch b
    cache.insert("d", fake_state([ord("d")] + list(range(99))))
    assert list(cache.entries) == ["b", "d"]
    assert cache.nbytes() <= cache.budget_bytes


def test_saved_prefixes_reload_only_for_the_same_model(tmp_path: Path) -> None:
    cache = PrefixCache("model-1")
    cache.insert("system:x", fake_state([5, 6, 7]))
    cache.insert("conv:y", fake_state([5, 6, 7, 8]))
    path = tmp_path / "kv.safetensors"
    assert cache.save(path) == 1
    same = PrefixCache("model-1")
    assert same.load(path) == 1 and list(same.entries) == ["system:x"]
    assert torch.equal(same.entries["system:x"].snapshot[1][0][1], cache.entries["system:x"].snapshot[1][0][1])
    assert PrefixCache("model-2").load(path) == 0
    path.write_bytes(b"garbage")
    assert PrefixCache("model-1").load(path) == 0


def test_two_processes_saving_one_file_keep_each_others_prompts(tmp_path: Path) -> None:
    """The window and the command line on one data folder: a save keeps the entries the other process saved
    (byte for byte, their checksums checked when read), within the budget; its own come first."""
    path = tmp_path / "kv.safetensors"
    window, cli = PrefixCache("model-1"), PrefixCache("model-1")
    window.insert("system:window", fake_state([5, 6, 7]))
    assert window.save(path) == 1
    cli.insert("system:template", fake_state([1, 2, 3, 4]))
    assert cli.save(path) == 2, "the window's prompt is kept"
    window.insert("system:later", fake_state([9, 9]))
    assert window.save(path) == 3, "and the command line's"
    fresh = PrefixCache("model-1")
    assert fresh.load(path) == 3 and not fresh.load_problems
    theirs, mine = fresh.entries["system:template"].snapshot, cli.entries["system:template"].snapshot
    assert torch.equal(theirs[0][0][0], mine[0][0][0])
    one_entry = joined(fake_state([1, 2, 3, 4]).snapshot())
    small = PrefixCache("model-1", budget_bytes=sum(k.nbytes + v.nbytes for k, v in one_entry))
    small.insert("system:mine", fake_state([4, 3, 2, 1]))
    assert small.save(path) == 1, "over the budget: this cache's own entries only"
    other = PrefixCache("model-2")
    other.insert("system:theirs", fake_state([1, 1]))
    assert other.save(path) == 1, "another model's file is replaced, never mixed in"


def _header_length(path: Path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def _saved_cache(tmp_path: Path) -> tuple[PrefixCache, Path]:
    cache = PrefixCache("model-1")
    cache.insert("system:a", fake_state([5, 6, 7]))
    cache.insert("system:b", fake_state([8, 9, 10, 11]))
    path = tmp_path / "kv.safetensors"
    assert cache.save(path) == 2
    return cache, path


def test_overwritten_tensor_bytes_drop_the_entry(tmp_path: Path) -> None:
    cache, path = _saved_cache(tmp_path)
    blob = bytearray(path.read_bytes())
    start = _header_length(path)
    blob[start : start + 16] = b"\x7f" * 16  # the first tensor in the file
    path.write_bytes(bytes(blob))
    again = PrefixCache("model-1")
    assert again.load(path) == 1, "the other entry is still good"
    (kept,) = again.entries
    assert torch.equal(again.entries[kept].snapshot[0][0][0], cache.entries[kept].snapshot[0][0][0])
    assert any("checksum" in p for p in again.load_problems)


def _write(path: Path, tensors: dict[str, torch.Tensor], entries: object, identity: str = "model-1") -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "2", "identity": identity, "entries": json.dumps(entries)})


def _entry(tokens: list[int], snapshot: tuple, identity: str = "model-1") -> dict[str, object]:
    return {
        "tokens": tokens,
        "layers": len(snapshot),
        "identity": identity,
        "sha256": checksum(identity, tokens, snapshot),
    }


def _tensors(key: str, snapshot: tuple) -> dict[str, torch.Tensor]:
    out = {}
    for i, (k, v) in enumerate(snapshot):
        out[f"{key}|{i}|k"], out[f"{key}|{i}|v"] = k.contiguous(), v.contiguous()
    return out


def _wrong_files() -> dict[str, tuple[dict[str, torch.Tensor], object]]:
    good = joined(fake_state([1, 2, 3]).snapshot())
    short = joined(fake_state([1, 2]).snapshot())  # two positions for three tokens, with a valid checksum
    flat = tuple((k[0], v[0]) for k, v in good)  # 3-D tensors
    return {
        "entries_as_list": (_tensors("system:a", good), [[1, 2, 3]]),
        "entries_not_json": (_tensors("system:a", good), "{not json"),
        "missing_keys": (_tensors("system:a", good), {"system:a": {"tokens": [1, 2, 3]}}),
        "tokens_not_ints": (_tensors("system:a", good), {"system:a": {**_entry([1, 2, 3], good), "tokens": ["a"]}}),
        "missing_tensor": ({}, {"system:a": _entry([1, 2, 3], good)}),
        "wrong_length": (_tensors("system:a", short), {"system:a": _entry([1, 2, 3], short)}),
        "wrong_rank": (_tensors("system:a", flat), {"system:a": _entry([1, 2, 3], flat)}),
        "other_identity": (_tensors("system:a", good), {"system:a": _entry([1, 2, 3], good, "model-2")}),
        "not_a_system_entry": (_tensors("conv:a", good), {"conv:a": _entry([1, 2, 3], good)}),
    }


@pytest.mark.parametrize("kind", list(_wrong_files()))
def test_a_valid_file_of_the_wrong_shape_is_not_used(tmp_path: Path, kind: str) -> None:
    tensors, entries = _wrong_files()[kind]
    path = tmp_path / "kv.safetensors"
    _write(path, tensors, entries)
    cache = PrefixCache("model-1")
    assert cache.load(path) == 0
    assert cache.entries == {} and cache.load_problems


@pytest.mark.parametrize("kind", ["crc32_tensors", "sha256_tensors"])
def test_a_document_file_is_checked_by_the_kind_it_was_saved_with(tmp_path: Path, kind: str) -> None:
    """Document KV files are saved with a CRC-32 a tensor; those saved before, with SHA-256 a tensor, still load;
    either way a changed byte drops the entry."""
    from engine.runtime.prefix_cache import CHECKS

    layers = joined(fake_state([1, 2, 3]).snapshot())
    entry = {"tokens": [1, 2, 3], "layers": len(layers), "identity": "model-1"}
    entry[kind] = CHECKS[kind]("model-1", [1, 2, 3], layers)
    path = tmp_path / "doc.safetensors"
    _write(path, _tensors("docs:a", layers), {"docs:a": entry})
    cache = PrefixCache("model-1")
    assert cache.load_entry(path, "docs:a") and not cache.load_problems
    assert torch.equal(cache.entries["docs:a"].snapshot[1][0][1], layers[1][1])
    blob = bytearray(path.read_bytes())
    blob[-3] ^= 0x01  # a bit of the last tensor
    path.write_bytes(bytes(blob))
    again = PrefixCache("model-1")
    assert not again.load_entry(path, "docs:a") and any("checksum" in p for p in again.load_problems)


def test_new_document_files_are_saved_with_a_crc_a_tensor(tmp_path: Path) -> None:
    cache = PrefixCache("model-1")
    cache.insert("docs:b", fake_state([4, 5, 6, 7]))
    path = tmp_path / "doc.safetensors"
    cache.save_entry("docs:b", path)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        saved = json.loads(fh.metadata()["entries"])["docs:b"]
    assert "crc32_tensors" in saved and "sha256_tensors" not in saved
    assert PrefixCache("model-1").load_entry(path, "docs:b")


def test_a_file_of_another_layout_is_not_used(tmp_path: Path) -> None:
    _, path = _saved_cache(tmp_path)  # 2 layers, 2 heads, head dim 8
    assert PrefixCache("model-1").load(path, layout=(2, 2, 8)) == 2
    for layout in [(3, 2, 8), (2, 4, 8), (2, 2, 16)]:
        cache = PrefixCache("model-1")
        assert cache.load(path, layout=layout) == 0 and cache.load_problems


def test_kv_layout_of_the_tiny_model(tiny_dir: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_dir)
    model = type("M", (), {"config": config})()
    layers, heads, head_dim = kv_layout(model)
    assert layers == config.num_hidden_layers and heads == config.num_key_value_heads
    assert head_dim == (getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    assert kv_layout(object()) is None


def test_a_failed_save_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    cache, path = _saved_cache(tmp_path)
    before = path.read_bytes()
    cache.insert("system:c", fake_state([1, 1, 1]))

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError):
        cache.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and not path.with_name(path.name + ".tmp").exists()


def test_restart_is_warm_and_exact(tiny_dir: Path) -> None:
    messages = [SYSTEM, {"role": "user", "content": "After a restart?"}]
    first = EngineRunner(str(tiny_dir))
    try:
        expected = cold(first, messages)
        first.run([SYSTEM, {"role": "user", "content": "seed the cache"}], sampling=GREEDY, answer_cache=False)
    finally:
        first.close()
    second = EngineRunner(str(tiny_dir))
    try:
        assert second.load_event.info.warm_prefixes >= 1
        ids, final = warm(second, messages, "after-restart")
        assert final.metrics.cached_tokens >= 20
        assert ids == expected
    finally:
        second.close()


def _seeded_kv_file(tiny_dir: Path, data: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[int]]:
    """A fresh data folder whose saved system-prompt KV came from a real run; and the cold reply."""
    monkeypatch.setenv("BRISK_DATA_DIR", str(data))
    first = EngineRunner(str(tiny_dir))
    try:
        expected = cold(first, [SYSTEM, {"role": "user", "content": "After damage?"}])
        first.run([SYSTEM, {"role": "user", "content": "seed the cache"}], sampling=GREEDY, answer_cache=False)
    finally:
        first.close()
    (path,) = (data / "cache" / "kv").glob("*.safetensors")
    return path, expected


def test_restart_with_overwritten_kv_is_cold_and_exact(tiny_dir: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    path, expected = _seeded_kv_file(tiny_dir, tmp_path, monkeypatch)
    blob = bytearray(path.read_bytes())
    start = _header_length(path)
    middle = start + (len(blob) - start) // 2
    blob[middle : middle + 64] = bytes(range(64))  # tensor data overwritten; the file still parses
    path.write_bytes(bytes(blob))
    second = EngineRunner(str(tiny_dir))
    try:
        assert isinstance(second.load_event, Loaded), second.load_event
        assert second.load_event.info.warm_prefixes == 0
        ids, final = warm(second, [SYSTEM, {"role": "user", "content": "After damage?"}], "after-damage")
        assert final.metrics.cached_tokens == 0, "no damaged KV is reused"
        assert ids == expected, "the reply equals a cold one"
    finally:
        second.close()


def test_restart_with_a_wrong_shaped_kv_file_still_loads(tiny_dir: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from safetensors import safe_open

    path, expected = _seeded_kv_file(tiny_dir, tmp_path, monkeypatch)
    with safe_open(str(path), "pt") as fh:
        identity = fh.metadata()["identity"]
    _write(path, {"x": torch.zeros(2)}, [[1, 2, 3]], identity=identity)
    second = EngineRunner(str(tiny_dir))
    try:
        assert isinstance(second.load_event, Loaded), second.load_event
        assert second.load_event.info.warm_prefixes == 0
        ids, _ = warm(second, [SYSTEM, {"role": "user", "content": "After damage?"}], "after-wrong-shape")
        assert ids == expected
    finally:
        second.close()


def test_a_damaged_kv_file_is_a_cache_warning_and_a_cold_start(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors import safe_open

    path, expected = _seeded_kv_file(tiny_dir, tmp_path, monkeypatch)
    with safe_open(str(path), "pt") as fh:
        identity = fh.metadata()["identity"]
    _write(path, {"x": torch.zeros(2)}, [[1, 2, 3]], identity=identity)  # entries as a JSON list
    second = EngineRunner(str(tiny_dir))
    try:
        assert isinstance(second.load_event, Loaded) and second.load_event.info.warm_prefixes == 0
        (warning,) = [w for w in second.client.warnings if w.kind == "cache"]
        assert path.name in warning.message and "damaged" in warning.message
        ids, _ = warm(second, [SYSTEM, {"role": "user", "content": "After damage?"}], "after-list")
        assert ids == expected
    finally:
        second.close()


def test_clear_prefix_cache_makes_the_next_reply_cold(tiny_engine: EngineRunner) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Clear me."}]
    done(tiny_engine.run(messages, sampling=GREEDY, answer_cache=False, conversation_id="clear"))
    tiny_engine.engine.clear_prefix_cache()
    final = done(tiny_engine.run(messages, sampling=GREEDY, answer_cache=False, conversation_id="clear"))
    assert final.metrics.cached_tokens == 0 and final.metrics.cache_bytes > 0


def test_conversation_grows_in_place_and_copies_only_on_branch(tiny_engine: EngineRunner) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Grow in place."}]
    done(tiny_engine.run(messages, sampling=GREEDY, answer_cache=False, conversation_id="grow"))
    entry = tiny_engine.engine.prefix_cache.entries["conv:grow"]
    buffer = entry.live.cache.layers[0].buf
    frozen = entry.snapshot[0][0][0].clone()
    reply = done(
        tiny_engine.run(messages, sampling=GREEDY, answer_cache=False, conversation_id="grow")
    ).text  # regenerate: a branch
    after = tiny_engine.engine.prefix_cache.entries["conv:grow"].live.cache.layers[0].buf
    assert after is not buffer, "regenerating crops below the pinned prefix, so it must copy"
    assert torch.equal(entry.snapshot[0][0][0], frozen), "the earlier snapshot is untouched"
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And more."}]
    done(tiny_engine.run(messages, sampling=GREEDY, answer_cache=False, conversation_id="grow"))
    grown = tiny_engine.engine.prefix_cache.entries["conv:grow"].live.cache.layers[0].buf
    assert grown is after, "a plain next turn extends the same buffer in place"


def test_started_event_reports_reuse_before_prefill(tiny_engine: EngineRunner) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Report reuse early."}]
    tiny_engine.run(messages, sampling=GREEDY, answer_cache=False, conversation_id="early")
    events = tiny_engine.run(messages, sampling=GREEDY, answer_cache=False, conversation_id="early")
    assert events[0].cached_tokens == done(events).metrics.cached_tokens == events[0].prompt_tokens - 1


def test_prefix_budget_can_change_at_run_time(tiny_dir: Path) -> None:
    runner = EngineRunner(str(tiny_dir))
    try:
        runner.run([SYSTEM, {"role": "user", "content": "fill"}], sampling=GREEDY, answer_cache=False)
        assert runner.engine.prefix_cache.nbytes() > 0
        runner.engine.set_prefix_budget(1)
        final = done(
            runner.run([{"role": "user", "content": "x"}], sampling=GREEDY, answer_cache=False, prefix_cache=False)
        )
        assert final.metrics.cache_bytes <= 1 or len(runner.engine.prefix_cache.entries) == 0
    finally:
        runner.close()


def test_a_branch_of_a_long_prefix_shares_it_and_holds_only_its_own_positions() -> None:
    from engine.model.kv import GrowingLayer

    base = fake_state(list(range(1000)), layers=1)
    shared = base.snapshot()[0][0][0]
    branch = KVState.from_snapshot(base.snapshot(), base.tokens)
    layer = branch.cache.layers[0]
    assert isinstance(layer, GrowingLayer)
    for i in range(5):  # a short reply on top of the shared prefix, as the eager path writes it
        parts = layer.append(torch.full((1, 2, 1, 8), float(i)), torch.full((1, 2, 1, 8), float(i)))
    branch.tokens += [7] * 5
    assert layer.length == 1005 and [p[0].shape[-2] for p in parts] == [1000, 5]
    assert parts[0][0].untyped_storage().data_ptr() == shared.untyped_storage().data_ptr(), "shared, not copied"
    assert layer.buf is not None and layer.buf.start == 1000 and layer.buf.capacity <= 5 + 256
    snap = branch.snapshot(1000)
    assert len(snap[0]) == 1 and torch.equal(snap[0][0][0], shared), "a snapshot within the prefix is the prefix"
    again = KVState.from_snapshot(branch.snapshot(), branch.tokens)  # a branch of the branch
    (k1, _), (k2, _) = again.cache.layers[0].segments()
    assert k1.untyped_storage().data_ptr() == shared.untyped_storage().data_ptr()
    assert torch.equal(k2[0, 0, :, 0], torch.arange(5.0)), "its own positions copied, the prefix shared"
    assert torch.equal(again.cache.layers[0].keys[..., :1000, :], shared), "reading all keys joins them in order"
    assert torch.equal(again.cache.layers[0].keys[0, 0, 1000:, 0], torch.arange(5.0))


def test_a_branch_of_a_branch_reads_its_positions_in_place_until_it_writes() -> None:
    """A reply that starts from a hint's finished prefill (``PrefixCache.finished``) copies nothing before its
    first token; its first write copies the hint's positions, and neither side sees the other's writes."""
    base = fake_state(list(range(100)), layers=1)
    hint = KVState.from_snapshot(base.snapshot(), base.tokens)
    hint.cache.layers[0].append(torch.full((1, 2, 4, 8), 5.0), torch.full((1, 2, 4, 8), 5.0))
    hint.tokens += [1, 2, 3, 4]
    own = hint.cache.layers[0].segments()[1][0]
    reply = KVState.from_snapshot(hint.snapshot(), hint.tokens)
    layer = reply.cache.layers[0]
    before = [k for k, _ in layer.segments()]
    assert [k.untyped_storage().data_ptr() for k in before] == [
        base.snapshot()[0][0][0].untyped_storage().data_ptr(),
        own.untyped_storage().data_ptr(),
    ], "both segments read where they are"
    hint.cache.layers[0].append(torch.full((1, 2, 2, 8), 9.0), torch.full((1, 2, 2, 8), 9.0))  # the hint goes on
    hint.tokens += [5, 6]
    parts = layer.append(torch.full((1, 2, 1, 8), 7.0), torch.full((1, 2, 1, 8), 7.0))  # the reply's first write
    reply.tokens.append(8)
    assert parts[1][0].untyped_storage().data_ptr() != own.untyped_storage().data_ptr(), "copied on write"
    assert parts[1][0][0, 0, :, 0].tolist() == [5.0, 5.0, 5.0, 5.0, 7.0]
    assert hint.cache.layers[0].segments()[1][0][0, 0, :, 0].tolist() == [5.0] * 4 + [9.0] * 2
    assert torch.equal(layer.keys[..., :100, :], base.snapshot()[0][0][0]) and layer.keys.shape[-2] == 105


def test_a_branch_that_outgrows_its_shared_prefix_takes_it_in_and_is_one_segment_again() -> None:
    """A document prefilled on top of a system prompt: the prompt's 10 positions are copied in (not the
    document's 50 copied out by every later chat that shares the document)."""
    base = fake_state(list(range(10)), layers=1)
    branch = KVState.from_snapshot(base.snapshot(), base.tokens)
    parts = branch.cache.layers[0].append(torch.ones(1, 2, 50, 8), torch.ones(1, 2, 50, 8))
    branch.tokens += [1] * 50
    assert [p[0].shape[-2] for p in parts] == [60]
    assert torch.equal(parts[0][0][..., :10, :], base.snapshot()[0][0][0])
    later = KVState.from_snapshot(branch.snapshot(), branch.tokens)
    shared = later.cache.layers[0].segments()[0][0]
    assert shared.untyped_storage().data_ptr() == parts[0][0].untyped_storage().data_ptr()


def test_cropping_a_branch_into_its_shared_prefix_and_writing_again() -> None:
    base = fake_state(list(range(10)), layers=1)
    before = base.snapshot()[0][0][0].clone()
    branch = KVState.from_snapshot(base.snapshot(), base.tokens)
    layer = branch.cache.layers[0]
    layer.append(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3, 8))
    branch.tokens += [1, 2, 3]
    branch.crop(6)  # an edit of an earlier turn: back into the shared prefix
    parts = layer.append(torch.zeros(1, 2, 2, 8), torch.zeros(1, 2, 2, 8))
    assert [p[0].shape[-2] for p in parts] == [6, 2]
    assert torch.equal(base.snapshot()[0][0][0], before), "the shared positions are never written"
    assert torch.equal(layer.keys[..., :6, :], before[..., :6, :]) and layer.keys.shape[-2] == 8


def test_a_conversation_prefers_its_own_entry_on_a_tie(tiny_engine: EngineRunner) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Twins ask the same."}]
    for name in ("tie-a", "tie-b"):  # two conversations holding the very same tokens
        reply = done(tiny_engine.run(messages, sampling=GREEDY, answer_cache=False, conversation_id=name)).text
    own = tiny_engine.engine.prefix_cache.entries["conv:tie-b"].live
    assert own is not None
    follow = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": "Next."}]
    done(tiny_engine.run(follow, sampling=GREEDY, answer_cache=False, conversation_id="tie-b"))
    after = tiny_engine.engine.prefix_cache.entries["conv:tie-b"].live
    assert after is own, "the conversation's own live state is continued, not a twin's snapshot adopted"


def test_lookup_prefers_the_named_entry_on_a_tie() -> None:
    cache = PrefixCache("m")
    twin, own = fake_state([1, 2, 3, 4]), fake_state([1, 2, 3, 4])
    cache.insert("a", twin, live=True)
    cache.insert("b", own, live=True)
    assert cache.lookup([1, 2, 3, 4, 5], prefer="b") is own
    assert cache.lookup([1, 2, 3, 4, 5], prefer="a") is twin
    other = cache.lookup([1, 2, 3, 4, 5], prefer="c")
    assert other is not own and other is not twin, "another conversation branches off a snapshot"
    assert other.tokens == [1, 2, 3, 4]


def test_dropped_kv_is_freed_without_the_garbage_collector(tiny_dir: Path) -> None:
    """No reference cycles: an evicted entry's megabytes go back at once, not at the next GC."""
    import gc
    import weakref

    from transformers import AutoModelForCausalLM

    from engine.model.kv import forward

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    cache = PrefixCache("tiny", budget_bytes=1 << 30)
    state = KVState()
    forward(model, state, list(range(5, 40)))
    branch = KVState.from_snapshot(state.snapshot(), state.tokens, 20)
    forward(model, branch, [7, 8])  # the branch copies into a buffer of its own
    cache.insert("conv:a", state, live=True)
    cache.insert("conv:b", branch, live=True)
    buffers = [weakref.ref(layer.buf.keys) for s in (state, branch) for layer in s.cache.layers]
    del state, branch
    gc.disable()
    try:
        cache.entries.clear()
        assert all(ref() is None for ref in buffers), "KV buffers outlived their last reference"
    finally:
        gc.enable()


def test_common_prefix_matches_a_plain_scan() -> None:
    import random

    from engine.model.kv import common_prefix

    rng = random.Random(0)
    for _ in range(3000):
        a = [rng.randint(0, 3) for _ in range(rng.randint(0, 40))]
        b = a[: rng.randint(0, len(a))] + [rng.randint(0, 3) for _ in range(rng.randint(0, 8))]
        expected = 0
        while expected < min(len(a), len(b)) and a[expected] == b[expected]:
            expected += 1
        assert common_prefix(a, b) == common_prefix(b, a) == expected
