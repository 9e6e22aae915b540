"""Attached documents on the engine: the same files give the same prefix, their KV is reused by other chats
and after a restart (read from disk), a changed file's old KV is never used, and caching never changes a
greedy reply.  The tiny model (byte tokens, 512 context) with an index of our own in each test."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from engine.api import Sampling, Warning
from engine.documents import render
from engine.documents.kvfiles import document_kv_dir, forget_document, kv_files
from engine.documents.retrieval import Hit
from engine.runtime.prompt_documents import Documents
from tests.support.engine_runner import EngineRunner, done, token_ids

GREEDY = Sampling(max_tokens=12)
SYSTEM = {"role": "system", "content": "Answer from the documents."}


@dataclass
class Info:
    id: str
    name: str
    path: str
    chars: int


class FakeIndex:
    """The document index's read side, in memory: whole texts, and 'passages' that are fixed slices."""

    def __init__(self) -> None:
        self.texts: dict[str, tuple[str, str]] = {}
        self.touched: list[str] = []

    def add(self, name: str, text: str) -> str:
        doc_id = uuid.uuid4().hex
        self.texts[doc_id] = (name, text)
        return doc_id

    def get(self, doc_id: str) -> Info | None:
        if doc_id not in self.texts:
            return None
        name, text = self.texts[doc_id]
        return Info(doc_id, name, f"/docs/{name}", len(text))

    def text(self, doc_id: str) -> str:
        return self.texts[doc_id][1]

    def touch(self, ids: list[str]) -> None:
        self.touched.extend(ids)

    def search(self, query: str, doc_ids: list[str], k: int = 6, query_vector: object = None) -> list[Hit]:
        hits = []
        for doc_id in doc_ids:
            name, text = self.texts[doc_id]
            for idx in (2, 0):  # best first: the third slice, then the first
                start, end = idx * 40, idx * 40 + 40
                hits.append(Hit(doc_id, name, f"/docs/{name}", idx, start, end, text[start:end], 0.0, None, None))
        return hits[:k]


@contextlib.contextmanager
def engine_on(tiny_dir: Path, index: FakeIndex) -> Iterator[EngineRunner]:
    """A new engine (a new process's, as far as the caches go) reading ``index``."""
    engine = EngineRunner(str(tiny_dir))
    engine.engine.documents = Documents(lambda: index)
    engine.index = index  # type: ignore[attr-defined]
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def runner(tiny_dir: Path, brisk_data_dir: Path) -> Iterator[EngineRunner]:
    with engine_on(tiny_dir, FakeIndex()) as engine:
        yield engine


def ask(runner: EngineRunner, question: str, documents: tuple[str, ...] = (), **kw: object):  # noqa: ANN201
    messages = [SYSTEM, {"role": "user", "content": question}]
    events = runner.run(messages, sampling=GREEDY, answer_cache=False, documents=documents, **kw)
    return events, done(events)


def rendered(runner: EngineRunner, question: str, ids: tuple[str, ...]) -> list[int]:
    """The reply to the document rendered by hand into the messages, no cache: what the engine must match."""
    index = runner.index  # type: ignore[attr-defined]
    whole = [render.Whole(i, index.texts[i][0], index.texts[i][1]) for i in ids]
    messages = render.with_documents([SYSTEM, {"role": "user", "content": question}], whole, [])
    return token_ids(runner.run(messages, sampling=GREEDY, answer_cache=False, prefix_cache=False))


NOTE = "The crane must be booked three days ahead. Badges are orange. Backups stay ninety days."


def test_a_whole_document_is_a_prefix_reused_by_another_chat_and_the_reply_is_unchanged(runner: EngineRunner) -> None:
    doc = runner.index.add("rules.md", NOTE)  # type: ignore[attr-defined]
    events, first = ask(runner, "How far ahead is the crane booked?", (doc,))
    assert token_ids(events) == rendered(runner, "How far ahead is the crane booked?", (doc,))
    assert first.metrics.document_tokens >= len(NOTE)  # byte tokens: at least one per character
    assert first.metrics.document_reused == 0
    assert [s["name"] for s in first.metrics.sources] == ["rules.md"] and first.metrics.sources[0]["chunk"] == -1
    events, second = ask(runner, "What colour are the badges?", (doc,))  # a new chat (its own conversation id)
    assert token_ids(events) == rendered(runner, "What colour are the badges?", (doc,))
    assert second.metrics.document_reused == second.metrics.document_tokens > 0
    assert second.metrics.cached_tokens >= second.metrics.document_tokens


def test_the_order_of_attaching_does_not_change_the_prefix(runner: EngineRunner) -> None:
    index = runner.index  # type: ignore[attr-defined]
    a, b = index.add("a.md", "Alpha notes: the code is 41."), index.add("b.md", "Beta notes: the code is 17.")
    _, first = ask(runner, "What is the alpha code?", (a, b))
    _, second = ask(runner, "What is the beta code?", (b, a))
    assert second.metrics.document_reused == second.metrics.document_tokens == first.metrics.document_tokens


def test_after_a_restart_the_document_kv_is_read_from_disk(tiny_dir: Path, brisk_data_dir: Path) -> None:
    index = FakeIndex()
    doc = index.add("rules.md", NOTE)
    with engine_on(tiny_dir, index) as before:
        ask(before, "How far ahead is the crane booked?", (doc,))
        identity = before.engine.prefix_cache.identity
    files = kv_files(doc)
    assert len(files) == 1 and files[0].parent == document_kv_dir(identity)
    with engine_on(tiny_dir, index) as after:
        events, reply = ask(after, "What colour are the badges?", (doc,))
        assert reply.metrics.document_reused == reply.metrics.document_tokens > 0
        assert token_ids(events) == rendered(after, "What colour are the badges?", (doc,))


def test_a_damaged_kv_file_is_a_warning_and_the_document_is_read_again(tiny_dir: Path, brisk_data_dir: Path) -> None:
    index = FakeIndex()
    doc = index.add("rules.md", NOTE)
    with engine_on(tiny_dir, index) as first:
        ask(first, "How far ahead is the crane booked?", (doc,))
    (path,) = kv_files(doc)
    data = bytearray(path.read_bytes())
    data[-10:] = b"\xff" * 10  # the KV's last bytes: the checksum no longer matches
    path.write_bytes(bytes(data))
    with engine_on(tiny_dir, index) as again:
        events, reply = ask(again, "What colour are the badges?", (doc,))
        assert reply.metrics.document_reused == 0
        assert any(isinstance(w, Warning) and w.kind == "cache" for w in again.client.warnings)
        assert token_ids(events) == rendered(again, "What colour are the badges?", (doc,))
    (fresh,) = kv_files(doc)  # the damaged file was replaced by a good one, which the next start reads
    with engine_on(tiny_dir, index) as third:
        _, reply = ask(third, "How far ahead is the crane booked?", (doc,))
        assert reply.metrics.document_reused == reply.metrics.document_tokens > 0
        assert not [w for w in third.client.warnings if w.kind == "cache"]


def test_chip_counts_use_a_copy_of_the_tokenizer(runner: EngineRunner) -> None:
    engine = runner.engine
    assert engine.count_tokens(["abc", "hello there"]) == [3, 11]  # byte tokens
    assert engine._counter is not None and engine._counter[1] is not engine.loaded.tokenizer


def test_a_changed_document_is_another_prefix_and_forgetting_removes_its_files(runner: EngineRunner) -> None:
    index = runner.index  # type: ignore[attr-defined]
    old = index.add("rules.md", NOTE)
    ask(runner, "How far ahead is the crane booked?", (old,))
    new = index.add("rules.md", NOTE.replace("three", "five"))
    events, reply = ask(runner, "How far ahead is the crane booked?", (new,))
    assert reply.metrics.document_reused < reply.metrics.document_tokens  # the old text's KV does not match
    assert token_ids(events) == rendered(runner, "How far ahead is the crane booked?", (new,))
    assert len(kv_files(old)) == 1 and len(kv_files(new)) == 1
    assert forget_document(old) == 1
    assert kv_files(old) == [] and len(kv_files(new)) == 1


def test_a_document_gone_from_the_index_is_a_warning_and_the_reply_goes_on(runner: EngineRunner) -> None:
    events, reply = ask(runner, "Hello there", ("0" * 64,))
    assert reply.text and reply.metrics.document_tokens == 0 and reply.metrics.sources == ()
    assert any(isinstance(w, Warning) and w.kind == "documents" for w in runner.client.warnings)


def test_a_document_too_long_to_fit_is_searched_and_its_passages_cited(runner: EngineRunner) -> None:
    index = runner.index  # type: ignore[attr-defined]
    long_text = " ".join(f"Line {i}: the value of item {i} is {i * 7}." for i in range(200))
    doc = index.add("big.md", long_text)
    events, reply = ask(runner, "What is the value of item 3?", (doc,))
    labels = [(s["label"], s["chunk"]) for s in reply.metrics.sources]
    assert labels == [("[1]", 0), ("[2]", 2)]  # document order, not the search's order
    passages = [render.Passage(doc, "big.md", i, i * 40, i * 40 + 40, long_text[i * 40 : i * 40 + 40]) for i in (2, 0)]
    messages = render.with_documents(
        [SYSTEM, {"role": "user", "content": "What is the value of item 3?"}], [], passages
    )
    assert "[1] big.md, part 1:" in messages[-1]["content"]
    cold = token_ids(runner.run(messages, sampling=GREEDY, answer_cache=False, prefix_cache=False))
    assert token_ids(events) == cold
    assert 0 < reply.metrics.document_tokens < len(long_text) and reply.metrics.document_reused == 0


def test_the_answer_cache_keys_on_the_documents(tiny_dir: Path, brisk_data_dir: Path) -> None:
    from engine.answer_cache import CacheKey, ModelIdentity
    from engine.api import Request

    identity = ModelIdentity("m", "float32", "none", "fp")
    plain = Request("a", ({"role": "user", "content": "What is in it?"},))
    one = replace(plain, documents=("x" * 64,))
    other = replace(plain, documents=("y" * 64,))
    keys = {CacheKey.for_request(identity, r).context for r in (plain, one, other)}
    assert len(keys) == 3
    both = replace(plain, documents=("x" * 64, "y" * 64))
    swapped = replace(plain, documents=("y" * 64, "x" * 64))
    assert CacheKey.for_request(identity, both).context == CacheKey.for_request(identity, swapped).context


def test_the_bundled_model_answers_the_same_from_a_reused_document(bundled_engine: EngineRunner) -> None:
    index = FakeIndex()
    doc = index.add("rules.md", NOTE + " The north workshop opens at half past seven.")
    saved = bundled_engine.engine.documents
    bundled_engine.engine.documents = Documents(lambda: index)
    bundled_engine.index = index  # type: ignore[attr-defined]
    try:
        ask(bundled_engine, "Hello there")  # the system prompt's own KV is kept: its tokens are no document's
        _, first = ask(bundled_engine, "How far ahead is the crane booked?", (doc,))
        assert first.metrics.cached_tokens > 0 and first.metrics.document_reused == 0
        for question in ("What colour are the badges?", "When does the north workshop open?"):
            events, reply = ask(bundled_engine, question, (doc,))
            assert reply.metrics.document_reused == reply.metrics.document_tokens > 0
            assert token_ids(events) == rendered(bundled_engine, question, (doc,)), question
    finally:
        bundled_engine.engine.documents = saved


def test_a_draft_being_typed_reads_the_document_kv_from_disk_and_warns_of_nothing(
    tiny_dir: Path, brisk_data_dir: Path
) -> None:
    from engine.api import Request
    from engine.documents.kvfiles import DOCUMENTS
    from tests.support.engine_runner import settle_hints as settle

    index = FakeIndex()
    doc = index.add("rules.md", NOTE)
    with engine_on(tiny_dir, index) as first:
        ask(first, "How far ahead is the crane booked?", (doc,))
    index.touched.clear()
    with engine_on(tiny_dir, index) as typing:  # a restart: the user attaches nothing new and types a question
        question = "What colour are the badges?"
        messages = (SYSTEM, {"role": "user", "content": question})
        for ids in ((doc,), (doc, "0" * 64)):  # the second draft also names a document gone from the index
            draft = Request(uuid.uuid4().hex, messages, GREEDY, conversation_id="typed", documents=ids)
            typing.engine.hint(draft)  # type: ignore[attr-defined]
            settle(typing)
        assert any(k.startswith(DOCUMENTS) for k in typing.engine.prefix_cache.entries)  # read while typing
        assert not [w for w in typing.client.warnings if w.kind == "documents"]  # drafts warn of nothing
        assert index.touched == [], "a draft is not a use of the document"
        events, reply = ask(typing, question, (doc,), conversation_id="typed")
        assert reply.metrics.document_reused == reply.metrics.document_tokens > 0
        assert token_ids(events) == rendered(typing, question, (doc,))
        assert index.touched == [doc], "the reply marks it used (by its Done)"


def typed_then_sent(runner: EngineRunner, question: str, documents: tuple[str, ...], between=None):  # noqa: ANN001, ANN201
    """``question`` as a draft (a hint, prefilled to its end), ``between()``, then its Send in the same chat;
    the reply's events and Done, and how often the Send rendered its documents."""
    from engine.api import Request
    from tests.support.engine_runner import settle_hints as settle

    messages = (SYSTEM, {"role": "user", "content": question})
    runner.engine.hint(Request(uuid.uuid4().hex, messages, GREEDY, conversation_id="c", documents=documents))  # type: ignore[attr-defined]
    settle(runner)
    if between is not None:
        between()
    engine = runner.engine
    rendered_now = []
    original = engine.serving._with_documents  # type: ignore[attr-defined]
    engine.serving._with_documents = lambda *a, **kw: rendered_now.append(1) or original(*a, **kw)  # type: ignore[attr-defined]
    try:
        events, reply = ask(runner, question, documents, conversation_id="c")
    finally:
        del engine.serving._with_documents  # type: ignore[attr-defined]
    return events, reply, len(rendered_now)


def test_a_send_of_the_typed_text_takes_the_hints_rendering_and_replies_the_same(runner: EngineRunner) -> None:
    doc = runner.index.add("rules.md", NOTE)  # type: ignore[attr-defined]
    question = "What colour are the badges?"
    events, reply, renders = typed_then_sent(runner, question, (doc,))
    assert renders == 0, "the Send of the text the hint rendered renders nothing again"
    assert reply.metrics.document_reused == reply.metrics.document_tokens > 0 and reply.metrics.computed_tokens == 0
    assert [s["name"] for s in reply.metrics.sources] == ["rules.md"]
    assert token_ids(events) == rendered(runner, question, (doc,))


def test_a_document_removed_after_the_hint_is_left_out_of_the_send_with_a_warning(runner: EngineRunner) -> None:
    index = runner.index  # type: ignore[attr-defined]
    doc = index.add("rules.md", NOTE)
    _, reply, renders = typed_then_sent(runner, "What colour are the badges?", (doc,), lambda: index.texts.pop(doc))
    assert renders == 1, "the hint's rendering holds a document the index no longer has: rendered again"
    assert reply.metrics.document_tokens == 0 and not reply.metrics.sources
    assert [w for w in runner.client.warnings if w.kind == "documents" and "no longer" in w.message]


def test_documents_never_push_the_question_out_of_the_prompt(runner: EngineRunner) -> None:
    index = runner.index  # type: ignore[attr-defined]
    doc = index.add("rules.md", "Rule: " + "the crane is booked three days ahead; " * 9)  # fits alone, not with this
    question = "Please tell me, in the fewest words you can manage, " * 4 + "how far ahead is the crane booked?"
    messages = [SYSTEM, {"role": "user", "content": question}]
    events = runner.run(messages, sampling=GREEDY, answer_cache=False, documents=(doc,))
    reply = done(events)
    assert not reply.metrics.truncated, "the question and the system prompt come first; documents get the rest"
    labels = [s["label"] for s in reply.metrics.sources]
    assert labels and all(label.startswith("[") for label in labels), "too long to go whole here: searched"
    assert 0 < reply.metrics.document_tokens < len(index.texts[doc][1])


def test_a_template_with_no_system_role_gets_the_documents_in_the_first_user_turn(
    tiny_dir: Path, brisk_data_dir: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    from engine.runtime.prompt import has_system_role

    folder = tmp_path / "no-system"
    shutil.copytree(tiny_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    index = FakeIndex()
    doc = index.add("rules.md", NOTE)
    with engine_on(folder, index) as engine:
        assert not has_system_role(engine.engine.loaded.tokenizer)
        messages = [{"role": "user", "content": "How far ahead is the crane booked?"}]
        reply = done(engine.run(messages, sampling=GREEDY, answer_cache=False, documents=(doc,)))
        assert reply.metrics.document_tokens >= len(NOTE) and reply.metrics.sources[0]["name"] == "rules.md"
    whole = [render.Whole(doc, "rules.md", NOTE)]
    into = render.with_documents(messages, whole, [], into_user=True)
    assert [m["role"] for m in into] == ["user"] and into[0]["content"].endswith("How far ahead is the crane booked?")


def test_replies_about_documents_are_not_answered_from_the_answer_cache(tiny_dir: Path, brisk_data_dir: Path) -> None:
    from engine.api import AnswerCacheSettings

    index = FakeIndex()
    doc = index.add("rules.md", NOTE)
    engine = EngineRunner(str(tiny_dir), answer_cache=AnswerCacheSettings(enabled=True, semantic=False))
    engine.engine.documents = Documents(lambda: index)
    try:
        messages = [SYSTEM, {"role": "user", "content": "How far ahead is the crane booked?"}]
        for _ in range(2):
            reply = done(engine.run(messages, sampling=GREEDY, documents=(doc,)))
            assert reply.metrics.answer_cache is None and reply.metrics.sources[0]["name"] == "rules.md"
        plain = [done(engine.run(messages, sampling=GREEDY)) for _ in range(2)]  # without documents it still hits
        assert plain[1].metrics.answer_cache == "exact"
    finally:
        engine.close()


def test_the_system_prompt_reused_before_the_documents_is_not_counted_as_documents(runner: EngineRunner) -> None:
    ask(runner, "Hello there")  # the system prompt's own KV is kept
    doc = runner.index.add("rules.md", NOTE)  # type: ignore[attr-defined]
    _, first = ask(runner, "How far ahead is the crane booked?", (doc,))
    assert first.metrics.cached_tokens > 0, "the system prompt's tokens come from the cache"
    assert first.metrics.document_reused == 0, "but none of the document's"
    _, second = ask(runner, "What colour are the badges?", (doc,))
    assert second.metrics.document_reused == second.metrics.document_tokens > 0
