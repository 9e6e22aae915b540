"""A synthetic folder of notes and questions about them, to measure the document index's retrieval.

:func:`make_corpus` writes ``n_files`` Markdown notes (``note-0000.md`` ...),
the same for the same ``n_files`` and ``seed``: each is a project in one of ten
fields, with filler that every note of its field shares and a few facts that
only it has (an invented project name, who led it, the day it began, a reading,
a budget, and for some an unusual incident).  The questions ask about those
facts in other words than the note's ("Who was in charge of ...?" for "...
led ..."; "birds harmed the solar panels" for "geese pecked through the solar
array's wiring"), so each has one right file.

:func:`measure` indexes such a folder into a :class:`DocumentStore` (words
first, then vectors) and asks every question three ways, BM25 alone, vectors
alone and hybrid, counting how often the right file is first (hit@1) or among
the six passages a prompt gets (hit@6), and how long a search takes.

    HF_HUB_OFFLINE=1 .venv/bin/python -m engine.documents.corpus /tmp/corpus 1000
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.documents.store import DocumentStore

K = 6  # passages a prompt gets (engine.runtime.prompt_documents.PASSAGES)
QUESTIONS = "questions.json"  # make_corpus saves its questions here, for measure


@dataclass(frozen=True)
class Question:
    text: str
    expected_path: str


@dataclass(frozen=True)
class Note:
    """A note read as it is (what ``DocumentStore.add`` needs of a converted file)."""

    path: str
    name: str
    text: str
    size_bytes: int
    mtime: float
    kind: str = "markdown"
    pages: int | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # what a project is called there
    quantity: str  # as the note says it
    asked: str  # as a question names it
    unit: str
    places: tuple[str, ...]
    filler: tuple[str, ...]


FIELDS = (
    Field("marine biology", "survey", "water salinity", "the saltiness of the sea", "ppt",
          ("Harrow Bay", "the Skerry shoals", "Port Alden"),
          ("Samples were taken at dawn from the research boat.", "The kelp beds near {place} were mapped again.",
           "Plankton counts followed the usual seasonal pattern.", "Divers logged visibility before each transect.",
           "The tide tables were checked against the harbour gauge.", "Seal sightings were noted but not counted.")),
    Field("bridge engineering", "inspection", "deck deflection", "the sag of the deck", "mm",
          ("the Orrin viaduct", "Mill Lane crossing", "the north span"),
          ("Bearings were greased and photographed.", "Traffic was limited to one lane during the work.",
           "Rust on the railings near {place} was scraped and primed.", "Strain gauges were read every hour.",
           "The expansion joints showed normal wear.", "A drone flew the underside of the span.")),
    Field("bakery operations", "trial", "oven temperature", "the heat of the ovens", "degrees Celsius",
          ("the Cobb Street shop", "the central kitchen", "the market stall"),
          ("The sourdough starter was fed twice a day.", "Flour deliveries arrived on Mondays.",
           "Staff at {place} tasted each batch before opening.", "Croissant dough rested overnight in the cold room.",
           "Waste was weighed at closing time.", "The proofing cabinet was cleaned every week.")),
    Field("software release", "migration", "error rate", "the share of failed requests", "per million requests",
          ("the staging cluster", "the Frankfurt region", "the build farm"),
          ("Feature flags guarded every new code path.", "On-call engineers reviewed the dashboards each morning.",
           "Logs from {place} were kept for thirty days.", "The database schema was versioned in the repository.",
           "Canary deployments ran for a full day.", "Release notes were drafted with the support team.")),
    Field("astronomy", "observing campaign", "sky brightness", "the darkness of the night sky", "magnitudes",
          ("the Cerro ridge dome", "the valley station", "the rooftop telescope"),
          ("Flat frames were taken at dusk.", "The mount was polar aligned again after the storm.",
           "Clouds rolled in over {place} after midnight.", "Variable stars were observed for the school outreach.",
           "The CCD was cooled well before the first exposure.", "Guide stars were picked from the catalogue.")),
    Field("vineyard", "harvest study", "grape sugar", "the sweetness of the grapes", "Brix",
          ("the south terraces", "the Lowmoor plot", "the old cellar block"),
          ("Pickers started before the heat of the day.", "Netting kept most of the starlings away.",
           "Leaves at {place} were thinned in July.", "Barrels were steamed before filling.",
           "The press ran late into the evening.", "Soil moisture probes were read after rain.")),
    Field("library archives", "digitisation project", "scanning throughput", "the pages digitised",
          "pages per hour", ("the map room", "the east reading room", "the basement stacks"),
          ("Volunteers handled the fragile ledgers with gloves.", "Catalogue records were checked against the shelf.",
           "Humidity in {place} was logged daily.", "Bindings were repaired before scanning.",
           "Metadata followed the Dublin Core fields.", "Visitors could browse the scans on a kiosk.")),
    Field("rail logistics", "timetable review", "freight load", "the cargo hauled", "tonnes",
          ("Garrow junction", "the harbour sidings", "the inland depot"),
          ("Shunting crews worked in two shifts.", "Signals were upgraded along the branch line.",
           "Wagons at {place} were weighed on the new scale.", "Drivers reported icy rails in January.",
           "Containers were tracked with barcode scans.", "The control room moved to a new building.")),
    Field("glacier monitoring", "field season", "ice melt", "the ice lost to melting", "centimetres",
          ("the Brenn icefield", "the upper moraine", "the meltwater lake"),
          ("Stakes were drilled into the ice in spring.", "The weather station ran on batteries all winter.",
           "Time-lapse cameras at {place} took a photo each hour.", "Crevasse fields were marked on the map.",
           "Supplies came up by helicopter twice.", "Snow pits were dug to measure density.")),
    Field("beekeeping", "apiary trial", "honey yield", "the honey harvested", "kilograms",
          ("the orchard apiary", "the heath hives", "the rooftop colony"),
          ("Frames were inspected every ten days.", "Varroa counts stayed low after treatment.",
           "Swarms near {place} were caught in bait boxes.", "Queens were marked with a dot of paint.",
           "Sugar syrup was fed in late autumn.", "Wax was rendered and sold at the fair.")),
)  # fmt: skip


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


FIRST = _words(
    "Oda Ansel Birgit Caius Dalia Emeric Freya Gideon Hana Ilse Jonas Kira Lorcan Mirela Nils Oona Pavel Quilla "
    "Rosalind Soren Talia Ulric Vesna Wim Xenia Yusuf Zora Anouk Bram Celeste"
)
LAST = _words(
    "Marsh Okafor Lindqvist Abernathy Castellan Drummond Eskola Fairweather Galloway Holt Ingram Jurado Kowalczyk "
    "Lachance Moravec Nakagawa Oyelaran Pettersen Quist Rasmussen Sandoval Thorne Underhill Valdivia Whitlock"
)
SYLLABLES = _words("kes trel mor ven ash tal bry quin dor fel gar lin ost par rhu sil tor ul vex wyn zar eld hob nim")
MONTHS = _words("January February March April May June July August September October November December")
# What any project's log says: the bulk of a note, shared by all of them.
ROUTINE = (
    "{person} circulated the minutes of the weekly meeting.",
    "The risk register was reviewed and two items were closed.",
    "{person} asked for the spare parts to be ordered early this time.",
    "A volunteer from the university joined for a fortnight.",
    "Photos from the site were uploaded to the shared drive.",
    "{person} updated the safety plan after the walk-through.",
    "The steering group agreed to keep the current schedule.",
    "Invoices for the last quarter were sent to finance.",
    "{person} gave a short talk about the work at the town hall.",
    "The equipment list was checked against the inventory.",
    "Two new laptops were set up for the field team.",
    "{person} drafted a summary for the annual report.",
)
# Unusual events, each in one note at most, and how a question puts them.
INCIDENTS = (
    ("A flock of geese pecked through the wiring of the solar array.", "birds harmed the solar panels"),
    ("A badger dug a tunnel under the equipment shed and the floor sagged.",
     "an animal burrowed beneath a storage hut"),
    ("The only spare key was dropped into the river from the footbridge.", "someone lost the backup key in water"),
    ("A lightning strike fried the radio mast during the August storm.", "the antenna was destroyed by a thunderbolt"),
    ("The coffee machine caught fire and the building was evacuated.",
     "people had to leave because a kitchen appliance started burning"),
    ("A goat wandered into the site office and ate the printed schedule.",
     "a farm animal devoured the paper timetable"),
    ("The team's van slid into a ditch on the icy mountain road.", "the vehicle skidded off the frozen road"),
    ("An owl nested in the ventilation duct for the whole spring.", "a bird of prey lived inside the air shaft"),
    ("A burst water main flooded the basement to knee height.", "a broken pipe left the lower floor under water"),
    ("Thieves stole the copper cable from the perimeter fence.", "metal wiring was taken by burglars"),
    ("A film crew rented the site for a week to shoot a detective series.", "a television show was recorded there"),
    ("The lead engineer broke her wrist skiing and worked from home.",
     "a senior technical person was injured on the slopes"),
)  # fmt: skip
# How questions ask for each fact: never in the note's words ("led", "kicked off", "measured", "capped").
ASKED = {
    "lead": ("Who was in charge of the {project} work?", "Which person headed {project}?", "Who ran {project}?"),
    "start": ("When did {project} get started?", "On what date did work on {project} begin?"),
    "reading": ("Which project put {asked} at {value} {unit}?", "Where was {asked} found to be {value} {unit}?"),
    "budget": ("How much money was {project} allowed to spend?", "What spending limit did {project} have?"),
    "incident": (
        "Which note says that {incident}?",
        "Where did it happen that {incident}?",
        "Was there a time {incident}?",
    ),
}
DISTRACTIONS = (
    "A delivery arrived two days late.",
    "The printer ran out of toner before the review.",
    "One meeting was moved because of a public holiday.",
    "A new fridge was bought for the staff room.",
    "The parking permits were renewed in spring.",
)


def _names(rng: random.Random, n: int) -> list[str]:
    seen: set[str] = set()
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def _note(i: int, rng: random.Random, project: str, incident: str | None) -> tuple[str, dict[str, str]]:
    field = FIELDS[i % len(FIELDS)]
    place = rng.choice(field.places)
    people = [f"{rng.choice(FIRST)} {rng.choice(LAST)}" for _ in range(3)]
    facts = {
        "project": project,
        "kind": field.kind,
        "lead": people[0],
        "date": f"{rng.randint(1, 28)} {MONTHS[rng.randrange(12)]} {2011 + rng.randrange(14)}",
        "value": f"{1000 + (i * 37) % 9000}.{i % 10}",  # unique for the first 9,000 notes
        "budget": f"{10 + i // 10},{(i * 7) % 10}{(i * 3) % 10}0",  # unique too (thousands, hundreds)
        "place": place,
    }
    fill = [s.format(place=place) for s in field.filler]
    rng.shuffle(fill)
    lines = [
        f"# {project}: {field.name} {field.kind}",
        "",
        f"Notes on the {project} {field.kind} at {place}. {fill[0]}",
        "",
        "## Background",
        "",
        f"{people[0]} led the {project} {field.kind}, with help from {people[1]} and {people[2]}. {fill[1]} {fill[2]}",
        "",
        f"The {project} {field.kind} was kicked off on {facts['date']}. {fill[3]}",
        "",
        "## Findings",
        "",
        f"At {place} the team measured the {field.quantity} at {facts['value']} {field.unit}. {fill[4]}",
        "",
        f"The {project} budget was capped at {facts['budget']} euros for the year.",
        "",
        "## Incidents",
        "",
        incident or rng.choice(DISTRACTIONS),
        "",
        "## Next steps",
        "",
        f"{fill[5]} The next review of {project} is planned with {people[1]}.",
        "",
        "## Log",
        "",
    ]
    year = 2011 + rng.randrange(14)
    for day in sorted(rng.sample(range(1, 365), 8)):
        entry = rng.choice(ROUTINE).format(person=rng.choice(people))
        lines.append(f"- {year}, day {day}: {entry}")
    lines.append("")
    return "\n".join(lines), facts


def make_corpus(folder: str | Path, n_files: int = 1000, seed: int = 0) -> list[Question]:
    """Write ``n_files`` notes into ``folder`` (earlier ``note-*.md`` removed) and return questions about them."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("note-*.md"):
        old.unlink()
    rng = random.Random(seed)
    projects = _names(rng, n_files)
    asked = rng.sample(range(n_files), min(n_files, 48))  # the notes questions are about, one question each
    incidents = {n: INCIDENTS[j] for j, n in enumerate(asked[: len(INCIDENTS)])}
    questions = []
    for i in range(n_files):
        incident = incidents.get(i)
        text, f = _note(i, rng, projects[i], incident[0] if incident else None)
        path = root / f"note-{i:04d}.md"
        path.write_text(text, encoding="utf-8")
        if i not in asked:
            continue
        field = FIELDS[i % len(FIELDS)]
        kind = "incident" if incident is not None else rng.choice(("lead", "start", "reading", "budget"))
        facts = {**f, "asked": field.asked, "unit": field.unit, "incident": incident[1] if incident else ""}
        q = rng.choice(ASKED[kind]).format(**facts)
        questions.append(Question(q, str(path)))
    (root / QUESTIONS).write_text(json.dumps([[q.text, q.expected_path] for q in questions], indent=1), "utf-8")
    return questions


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def measure(
    folder: str | Path,
    store: DocumentStore,
    embed: Callable[[list[str]], np.ndarray | None],
    questions: list[Question] | None = None,
) -> dict[str, Any]:
    """Index every ``*.md`` of ``folder`` into ``store`` and ask ``questions`` (None: the ones
    :func:`make_corpus` saved in the folder); returns the times and hit rates :func:`table` prints."""
    root = Path(folder)
    files = sorted(root.glob("*.md"))
    began = time.perf_counter()
    ids = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        stat = path.stat()
        ids.append(store.add(Note(str(path), path.name, text, stat.st_size, stat.st_mtime)).id)
    words_s = time.perf_counter() - began
    began = time.perf_counter()
    chunks = store.embed_missing(embed)
    vectors_s = time.perf_counter() - began
    if questions is None:
        saved = json.loads((root / QUESTIONS).read_text(encoding="utf-8"))
        questions = [Question(text, path) for text, path in saved]
    results: dict[str, Any] = {
        "files": len(files),
        "chunks": chunks,
        "index_words_s": words_s,
        "index_vectors_s": vectors_s,
        "questions": len(questions),
    }
    times: dict[str, list[float]] = {"bm25": [], "vectors": [], "hybrid": [], "embed question": []}
    hits: dict[str, list[int]] = {"bm25": [0, 0], "vectors": [0, 0], "hybrid": [0, 0]}
    for q in questions:
        began = time.perf_counter()
        vectors = embed([q.text])
        times["embed question"].append(time.perf_counter() - began)
        vector = None if vectors is None else vectors[0]
        for method, query, v in (("bm25", q.text, None), ("vectors", "", vector), ("hybrid", q.text, vector)):
            began = time.perf_counter()
            found = store.search(query, ids, K, query_vector=v)
            times[method].append(time.perf_counter() - began)
            paths = [h.path for h in found]
            hits[method][0] += bool(paths) and paths[0] == q.expected_path
            hits[method][1] += q.expected_path in paths
    for method, values in times.items():
        results[method] = {
            "median_ms": statistics.median(values) * 1e3,
            "p95_ms": _percentile(values, 0.95) * 1e3,
            "first_ms": values[0] * 1e3,
        }
        if method in hits:
            results[method]["hit@1"] = hits[method][0] / len(questions)
            results[method][f"hit@{K}"] = hits[method][1] / len(questions)
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{results['files']} files, {results['chunks']} chunks; indexing: words {results['index_words_s']:.1f} s, "
        f"vectors {results['index_vectors_s']:.1f} s; {results['questions']} questions",
        f"{'method':<16}{'hit@1':>8}{'hit@' + str(K):>8}{'median ms':>11}{'p95 ms':>9}{'first ms':>10}",
    ]
    for method in ("bm25", "vectors", "hybrid", "embed question"):
        r = results[method]
        rates = f"{r['hit@1']:>8.2f}{r[f'hit@{K}']:>8.2f}" if "hit@1" in r else f"{'':>16}"
        lines.append(f"{method:<16}{rates}{r['median_ms']:>11.2f}{r['p95_ms']:>9.2f}{r['first_ms']:>10.2f}")
    return "\n".join(lines)


def measure_folder(folder: str | Path, n_files: int, embedder: Any, seed: int = 0) -> dict[str, Any]:
    """:func:`make_corpus` into ``folder``, then :func:`measure` on a new index in a temporary folder;
    ``embedder``: an ``Embedder`` (ready) or an embed function.  The result has its :func:`table` too."""
    questions = make_corpus(folder, n_files, seed)
    embed = embedder.embed if hasattr(embedder, "embed") else embedder
    with tempfile.TemporaryDirectory(prefix="brisk-index-") as tmp:
        store = DocumentStore(Path(tmp) / "documents.db")
        try:
            results = measure(folder, store, embed, questions)
        finally:
            store.close()
    results["table"] = table(results)
    return results


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 3:
        print("usage: python -m engine.documents.corpus FOLDER [N_FILES] [SEED]", file=sys.stderr)
        return 2
    from engine.answer_cache.embed import shared_embedder

    embedder = shared_embedder()
    if not embedder.wait(120):
        print(f"The embedder did not load: {embedder.error}", file=sys.stderr)
        return 1
    n, seed = int(argv[1]) if len(argv) > 1 else 1000, int(argv[2]) if len(argv) > 2 else 0
    print(measure_folder(Path(argv[0]), n, embedder, seed)["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
