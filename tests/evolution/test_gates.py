"""The Critic's gates: hand-computed cases, planted leakage, boundaries, and slow loop twins."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from coevo.evolution.added_text import added_segments, added_words, edit_text
from coevo.evolution.bloat import bloat
from coevo.evolution.leakage import leakage, leakage_detail, normalise_answer, words
from coevo.evolution.outcome_gates import combine, performance_gate, seesaw_gate
from coevo.evolution.quality_gate import ETA_BLOAT, ETA_LEAK, quality_gate
from coevo.harness.defaults import base_harness
from coevo.harness.edits import Edit, apply_edit
from coevo.harness.library.context import DEFAULT_SYSTEM_PROMPT
from coevo.rundir.evolve_records import QualityReport

# ------------------------------------------------------------------------------- loop twins


def _contains(seq: list[str], sub: list[str]) -> bool:
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def slow_leakage(added, answers, texts, allowed=(), ngram=8, min_words=4, fingerprint_chars=6):
    """The leakage rules spelled out with brute-force scans."""
    a_words = words(added)
    considered, leaked, fingerprint = 0, [], False
    for task in sorted(answers):
        norm = normalise_answer(answers[task])
        if norm is None:
            continue
        considered += 1
        if _contains(a_words, norm.split()):
            leaked.append(norm)
            if len(norm) >= fingerprint_chars:
                fingerprint = True
    if fingerprint:
        score = 1.0
    elif considered:
        score = len(leaked) / considered
    else:
        score = 0.0
    runs = []
    for task in sorted(texts):
        toks = words(texts[task])
        if len(toks) < min_words:
            continue
        m = min(ngram, len(toks))
        others = [words(a) for a in allowed] + [words(texts[o]) for o in texts if o != task]
        covered = [False] * len(toks)
        any_hit = False
        for i in range(len(toks) - m + 1):
            gram = toks[i : i + m]
            if any(_contains(o, gram) for o in others):
                continue
            if _contains(a_words, gram):
                any_hit = True
                for j in range(i, i + m):
                    covered[j] = True
        if any_hit:
            score = 1.0
            run: list[str] = []
            for tok, c in zip(toks, covered, strict=True):
                if c:
                    run.append(tok)
                elif run:
                    runs.append(" ".join(run))
                    run = []
            if run:
                runs.append(" ".join(run))
    offending = []
    for s in leaked + runs:
        if s not in offending:
            offending.append(s)
    return score, offending


def slow_seesaw(before, after, scope):
    passed_before = {t: any(v) for t, v in before.items()}
    passed_after = {t: any(v) for t, v in after.items()}
    f2p, p2f = [], []
    for t in sorted(before):
        if t not in scope and not passed_before[t]:
            continue
        if t not in passed_after:
            continue
        if passed_before[t] and not passed_after[t]:
            p2f.append(t)
        if not passed_before[t] and passed_after[t]:
            f2p.append(t)
    return (len(p2f) == 0 and len(f2p) > 0), f2p, p2f


def slow_performance(cb, ca, rb, ra, delta, eps):
    """Exact rational arithmetic: no tolerance needed."""
    if ca - cb < delta:
        return False
    for b, a in zip(rb, ra, strict=True):
        if b - a > eps:
            return False
    return True


def slow_bloat(edits, harness, chars_per_example=400):
    """Build the candidate with the real algebra and compare processors by name."""
    after = harness
    for e in edits:
        after = apply_edit(after, e)

    def demos(h):
        return list(h.get("few_shot").config["demos"]) if "few_shot" in h else []

    old = demos(harness)
    old_pairs = [tuple(old[i : i + 2]) for i in range(0, len(old), 2)]
    new = demos(after)
    added = 0
    for i in range(0, len(new), 2):
        pair = tuple(new[i : i + 2])
        if pair in old_pairs:
            old_pairs.remove(pair)
        else:
            added += 1
    growth = 0
    for p in after:
        if p.kind not in ("system_prompt", "instruction_template", "tool_schema_hint"):
            continue
        before_len = len(harness.get(p.name).config["template"]) if p.name in harness else 0
        growth += max(0, len(p.config["template"]) - before_len)
    return added + growth / chars_per_example, added, growth


# ------------------------------------------------------------------------------- helpers


def demo_edit(*texts: str, name: str = "few_shot") -> Edit:
    return Edit("insert", name, spec={"kind": "few_shot", "name": name, "params": {"demos": list(texts)}})


def prompt_edit(template: str) -> Edit:
    return Edit("set_param", "system_prompt", param="template", value=template)


LONG_TASK = (
    "A farmer has seventeen sheep and buys nine more at the market on Tuesday; "
    "later a storm scatters four of them. How many sheep remain?"
)


# ------------------------------------------------------------------------------- added text


def test_added_words_keeps_long_shared_runs_only():
    old = "You are a careful problem solver. Think step by step."
    new = "You are a careful problem solver. Always check units. Think step by step."
    assert added_words(old, new) == ["Always check units."]
    assert added_words("", "hello world") == ["hello world"]
    assert added_words("same text here", "same text here") == []
    # a pasted sentence sharing only "the" with the old prompt stays in one piece
    assert added_words("Use the tools.", "Use the tools. Compute the sum of the list") == [
        "Compute the sum of the list"
    ]


def test_added_segments_reports_new_prompt_words_and_demo_turns():
    h = base_harness()
    edits = [
        prompt_edit(DEFAULT_SYSTEM_PROMPT + " Use the calculator for every step."),
        demo_edit("What is 2 + 3?", "<answer>5</answer>"),
    ]
    segs = added_segments(edits, h)
    assert [(s.processor, s.param, s.text, s.role) for s in segs] == [
        ("system_prompt", "template", "Use the calculator for every step.", None),
        ("few_shot", "demos", "What is 2 + 3?", "user"),
        ("few_shot", "demos", "<answer>5</answer>", "assistant"),
    ]
    assert edit_text(edits, h) == "Use the calculator for every step.\nWhat is 2 + 3?\n<answer>5</answer>"


def test_added_segments_compares_replaced_and_reinserted_processors_with_the_old_one():
    h = apply_edit(base_harness(), demo_edit("q1", "a1"))
    demos = {"demos": ["q1", "a1", "q2", "a2"]}
    replace = Edit("replace", "few_shot", spec={"kind": "few_shot", "name": "few_shot", "params": demos})
    assert [s.text for s in added_segments([replace], h)] == ["q2", "a2"]
    again = [Edit("remove", "few_shot"), demo_edit("q1", "a1", "q3", "a3")]
    assert [s.text for s in added_segments(again, h)] == ["q3", "a3"]
    renamed = Edit("replace", "few_shot", spec={"kind": "few_shot", "name": "demos2",
                                                "params": {"demos": ["q1", "a1"]}})
    assert [s.text for s in added_segments([renamed], h)] == []
    assert added_segments([Edit("remove", "few_shot")], h) == []
    # without the parent harness everything an edit carries counts
    assert [s.text for s in added_segments([replace], None)] == ["q1", "a1", "q2", "a2"]


def test_added_segments_reads_code_source_and_nested_init_params():
    spec = {
        "kind": "code",
        "name": "MyDemos",
        "params": {"source": "class MyDemos(FewShotDemos):\n    pass", "class_name": "MyDemos",
                   "init_params": {"demos": ["What is 40 + 2?", "42"]}},
    }
    segs = added_segments([Edit("insert", "MyDemos", spec=spec)], base_harness())
    assert ("init_params.demos", "42", "assistant") in [(s.param, s.text, s.role) for s in segs]
    assert any(s.param == "source" and "FewShotDemos" in s.text for s in segs)


# ------------------------------------------------------------------------------- leakage


def test_answer_normalisation_rules():
    assert normalise_answer(" 34 ") == "34"
    assert normalise_answer("3.50") == "3.5"
    assert normalise_answer("0042") == "42"
    assert normalise_answer("007") is None  # canonically "7": one character
    assert normalise_answer("Yes") is None
    assert normalise_answer("the answer") is None
    assert normalise_answer("Saint-Petersburg") == "saint petersburg"
    assert normalise_answer(-12) == "12"


def test_leakage_answer_share_hand_computed():
    answers = {"t1": 34, "t2": "7", "t3": "Yes", "t4": 19, "t5": 250}
    # considered: t1, t4, t5 (t2 is one character, t3 a common word); only 34 appears
    score, offending = leakage("Example: 12 + 22 = 34.", answers, {})
    assert score == pytest.approx(1 / 3)
    assert offending == ["34"]
    # whole tokens only: 340 and 1234 do not contain the answer 34
    assert leakage("340 and 1234", answers, {}) == (0.0, [])
    # canonical numbers: 3.50 in the answers matches 3.5 in the text
    assert leakage("it costs 3.5 dollars", {"a": "3.50", "b": "99"}, {}) == (0.5, ["3.5"])


def test_leakage_fingerprint_answer_scores_one_alone():
    answers = {f"t{i}": str(100 + i) for i in range(20)} | {"city": "Saint Petersburg"}
    score, offending = leakage("Remember: the capital was saint petersburg.", answers, {})
    assert score == 1.0
    assert offending == ["saint petersburg"]


def test_leakage_copied_ngram_of_a_long_task_scores_one():
    texts = {"farm": LONG_TASK}
    added = "Hint: a farmer has seventeen sheep and buys nine more at the market, think."
    d = leakage_detail(added, {}, texts)
    assert d.score == 1.0
    # task words: a farmer has seventeen sheep and buys nine more at the market on tuesday ...
    # copied run: "a farmer has seventeen sheep and buys nine more at the market" (12 words → 5 8-grams)
    assert d.copied == {"farm": ["a farmer has seventeen sheep and buys nine more at the market"]}
    n_words = len(words(LONG_TASK))
    assert d.containment == {"farm": pytest.approx(5 / (n_words - 7))}
    # seven copied words are not an 8-gram
    assert leakage("a farmer has seventeen sheep and buys", {}, texts) == (0.0, [])


def test_leakage_short_task_text_is_one_ngram():
    texts = {"t": "What is 12 + 22?"}
    assert leakage("Q: What is 12 + 22? A: 34", {}, texts) == (1.0, ["what is 12 22"])
    assert leakage("Q: What is 12 + 23?", {}, texts) == (0.0, [])
    # texts under min_words words are skipped
    assert leakage("compute 5", {}, {"t": "compute 5"}) == (0.0, [])


def test_leakage_ignores_template_shared_with_other_tasks_and_allowed_texts():
    note = "Give your final answer as a single number inside answer tags please."
    texts = {"a": "What is 12 + 22? " + note, "b": "What is 5 + 60? " + note}
    demo = "What is 3 + 9? " + note
    assert leakage(demo, {}, texts) == (0.0, [])
    # with one task only the note is specific to it, unless it is an allowed text
    assert leakage(demo, {}, {"a": texts["a"]})[0] == 1.0
    assert leakage(demo, {}, {"a": texts["a"]}, allowed=[demo]) == (0.0, [])


def test_leakage_agrees_with_loop_twin_on_random_inputs():
    rng = random.Random(1234)
    vocab = ["alpha", "beta", "gamma", "delta", "sum", "of", "the", "yes", "12", "34", "7", "3.50", "paris"]
    for _ in range(300):
        texts = {f"t{i}": " ".join(rng.choice(vocab) for _ in range(rng.randint(2, 10)))
                 for i in range(rng.randint(0, 4))}
        answers = {f"t{i}": rng.choice(vocab + ["saint petersburg", "x"]) for i in range(rng.randint(0, 5))}
        pieces = [rng.choice(vocab) for _ in range(rng.randint(0, 12))]
        if texts and rng.random() < 0.5:
            src = words(rng.choice(list(texts.values())))
            i = rng.randint(0, len(src))
            pieces += src[i : i + rng.randint(1, 8)]
        if answers and rng.random() < 0.3:
            pieces.append(str(rng.choice(list(answers.values()))))
        if rng.random() < 0.3:
            rng.shuffle(pieces)
        added = " ".join(pieces)
        allowed = [" ".join(rng.choice(vocab) for _ in range(6))] if rng.random() < 0.3 else []
        n, mw = rng.randint(2, 5), rng.randint(1, 4)
        got = leakage(added, answers, texts, ngram=n, allowed=allowed, min_words=mw)
        want = slow_leakage(added, answers, texts, allowed, ngram=n, min_words=mw)
        assert got[0] == pytest.approx(want[0])
        assert got[1] == want[1]


def test_leakage_rejects_bad_ngram():
    with pytest.raises(ValueError, match="ngram"):
        leakage("x", {}, {}, ngram=0)


# ------------------------------------------------------------------------------- bloat


def test_bloat_hand_computed():
    h = base_harness()
    edits = [demo_edit("q1", "a1", "q2", "a2", "q3", "a3"), prompt_edit(DEFAULT_SYSTEM_PROMPT + "x" * 200)]
    assert tuple(bloat(edits, h)) == (3.5, 3, 200)
    h2 = apply_edit(h, edits[0])
    reorder = Edit("set_param", "few_shot", param="demos", value=["q3", "a3", "q1", "a1", "q2", "a2"])
    assert tuple(bloat([reorder], h2)) == (0.0, 0, 0)
    one_more = Edit("set_param", "few_shot", param="demos", value=["q1", "a1", "q2", "a2", "q3", "a3", "q4", "a4"])
    assert tuple(bloat([one_more], h2)) == (1.0, 1, 0)
    shorter = prompt_edit("Be brief.")
    assert tuple(bloat([shorter], h)) == (0.0, 0, 0)
    with pytest.raises(ValueError, match="chars_per_example"):
        bloat([shorter], h, chars_per_example=0)


def test_bloat_agrees_with_building_the_candidate():
    rng = random.Random(7)
    pool = [f"q{i}" for i in range(6)]
    for _ in range(150):
        h = base_harness()
        if rng.random() < 0.5:
            h = apply_edit(h, demo_edit(*[x for i in range(rng.randint(1, 3)) for x in (f"q{i}", f"a{i}")]))
        edits, current = [], h
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            demos = [x for q in rng.sample(pool, rng.randint(0, 4)) for x in (q, "a" + q[1:])]
            if "few_shot" in current and choice < 0.3:
                e = Edit("set_param", "few_shot", param="demos", value=demos)
            elif "few_shot" in current and choice < 0.45:
                e = Edit("remove", "few_shot")
            elif "few_shot" in current and choice < 0.6:
                spec = {"kind": "few_shot", "name": "few_shot", "params": {"demos": demos}}
                e = Edit("replace", "few_shot", spec=spec)
            elif "few_shot" not in current and choice < 0.6:
                e = demo_edit(*demos)
            else:
                e = prompt_edit("p" * rng.randint(0, 900))
            edits.append(e)
            current = apply_edit(current, e)
        got = bloat(edits, h, chars_per_example=300)
        assert tuple(got) == pytest.approx(slow_bloat(edits, h, chars_per_example=300))


# ------------------------------------------------------------------------------- quality gate


FAILED = {"t1": "What is 12 + 22?", "t2": LONG_TASK}
ANSWERS = {"t1": 34, "t2": 22}


def test_clean_demo_passes_the_quality_gate():
    report = quality_gate(
        [demo_edit("What is 5 + 9?", "The calculator says 14.\n<answer>14</answer>")],
        base_harness(), ANSWERS, FAILED, eta_leak=ETA_LEAK, eta_bloat=ETA_BLOAT,
    )
    assert isinstance(report, QualityReport)
    assert report.passed and report.leakage == 0.0 and report.bloat == 1.0 and report.leaked == []
    assert report.reason.startswith("quality ok")


def test_planted_answer_is_caught_and_named():
    report = quality_gate(
        [demo_edit("What is 30 + 4?", "<answer>34</answer>")], base_harness(), ANSWERS, FAILED,
        eta_leak=ETA_LEAK, eta_bloat=ETA_BLOAT,
    )
    assert not report.passed
    assert report.leakage == 0.5 and report.leaked == ["34"]
    assert "'34'" in report.reason and "leakage 0.50 > 0.20" in report.reason


def test_planted_instruction_words_are_caught():
    planted = "Sheep puzzle: seventeen sheep and buys nine more at the market on Tuesday, then subtract."
    report = quality_gate(
        [prompt_edit(DEFAULT_SYSTEM_PROMPT + " " + planted)], base_harness(), ANSWERS, FAILED,
        eta_leak=ETA_LEAK, eta_bloat=ETA_BLOAT,
    )
    assert not report.passed and report.leakage == 1.0
    assert report.leaked == ["seventeen sheep and buys nine more at the market on tuesday"]
    assert "t2:" in report.reason


def test_bloat_rejection_names_figure_and_threshold():
    demos = [x for i in range(6) for x in (f"What is {i} + {i}?", f"<answer>{2 * i}</answer>")]
    report = quality_gate([demo_edit(*demos)], base_harness(), {}, {}, eta_leak=0.2, eta_bloat=5)
    assert not report.passed and report.bloat == 6.0 and report.leakage == 0.0
    assert "bloat 6.0 > 5 injected examples: 6 new demonstration pair(s)" in report.reason
    ok = quality_gate([demo_edit(*demos[:10])], base_harness(), {}, {}, eta_leak=0.2, eta_bloat=5)
    assert ok.passed and ok.bloat == 5.0  # exactly at the threshold passes


def test_quality_gate_validates_thresholds():
    with pytest.raises(ValueError, match="eta_leak"):
        quality_gate([], base_harness(), {}, {}, eta_leak=1.5, eta_bloat=5)
    with pytest.raises(ValueError, match="eta_bloat"):
        quality_gate([], base_harness(), {}, {}, eta_leak=0.2, eta_bloat=-1)


# ------------------------------------------------------------------------------- seesaw


def test_seesaw_single_regression_vetoes_many_gains():
    before = {f"f{i}": [False, False] for i in range(10)} | {"p": [True, False]}
    after = {f"f{i}": [True, False] for i in range(10)} | {"p": [False, False]}
    outcome, f2p, p2f, reason = seesaw_gate(before, after, scope=list(before))
    assert outcome == "reject" and p2f == ["p"] and f2p == [f"f{i}" for i in range(10)]
    assert "pass→fail" in reason and "['p']" in reason


def test_seesaw_ships_with_a_gain_and_no_regression():
    before = {"a": [False, False], "b": [True, True], "c": [False, False]}
    after = {"a": [False, True], "b": [True, False], "c": [False, False]}
    assert tuple(seesaw_gate(before, after, scope=["a", "c"]))[:3] == ("ship", ["a"], [])
    no_gain = seesaw_gate(before, {"a": [False], "b": [True], "c": [False]}, scope=["a", "c"])
    assert no_gain.outcome == "reject" and no_gain.reason.startswith("reject: no fail→pass")


def test_seesaw_checks_tasks_that_passed_before_outside_scope_and_errors_on_missing_scope():
    before = {"a": [False], "x": [True], "y": [False]}
    # x is outside scope but passed before: its regression vetoes; y outside scope is ignored
    r = seesaw_gate(before, {"a": [True], "x": [False], "y": [True]}, scope=["a"])
    assert (r.outcome, r.fail_to_pass, r.pass_to_fail) == ("reject", ["a"], ["x"])
    with pytest.raises(ValueError, match=r"after lacks scope tasks of before: \['a'\]"):
        seesaw_gate(before, {"x": [True]}, scope=["a"])
    with pytest.raises(ValueError, match="no outcomes in before"):
        seesaw_gate(before, {"a": [True], "z": [True]}, scope=["z"])
    unjudged = seesaw_gate(before, {"a": [True]}, scope=["a"])
    assert unjudged.outcome == "ship" and "not re-run after: ['x']" in unjudged.reason


def test_seesaw_agrees_with_loop_twin():
    rng = random.Random(99)
    for _ in range(400):
        tasks = [f"t{i}" for i in range(rng.randint(1, 8))]
        before = {t: [rng.random() < 0.4 for _ in range(2)] for t in tasks}
        scope = [t for t in tasks if rng.random() < 0.6]
        after = {t: [rng.random() < 0.5 for _ in range(2)] for t in tasks if t in scope or rng.random() < 0.8}
        outcome, f2p, p2f, _ = seesaw_gate(before, after, scope=scope)
        assert (outcome == "ship", f2p, p2f) == slow_seesaw(before, after, scope)


# ------------------------------------------------------------------------------- performance


def test_performance_gate_boundaries_pass():
    # exactly delta: 0.3 - 0.2 is 0.09999999999999998 in floating point and still passes
    assert performance_gate(0.2, 0.3, [], [], delta=0.1, epsilon=0.0).outcome == "ship"
    # exactly epsilon on a recent batch
    assert performance_gate(0.5, 0.5, [0.7], [0.675], delta=0.0, epsilon=0.025).outcome == "ship"
    # just past either boundary fails, and the reason says which
    r = performance_gate(0.2, 0.29, [], [], delta=0.1, epsilon=0.0)
    assert r.outcome == "reject" and "delta 0.1" in r.reason
    r = performance_gate(0.5, 0.6, [0.7, 0.9], [0.7, 0.85], delta=0.0, epsilon=0.025)
    assert r.outcome == "reject" and "recent batch(es) [1]" in r.reason


def test_performance_gate_validates_inputs():
    with pytest.raises(ValueError, match="recent_before and recent_after"):
        performance_gate(0.1, 0.2, [0.1], [], delta=0.0, epsilon=0.0)
    with pytest.raises(ValueError, match="delta and epsilon"):
        performance_gate(0.1, 0.2, [], [], delta=-0.1, epsilon=0.0)
    with pytest.raises(ValueError, match=r"recent_after\[0\]"):
        performance_gate(0.1, 0.2, [0.1], [1.5], delta=0.0, epsilon=0.0)
    with pytest.raises(ValueError, match="current_before"):
        performance_gate(float("nan"), 0.2, [], [], delta=0.0, epsilon=0.0)


def test_performance_gate_agrees_with_exact_twin():
    rng = random.Random(5)
    for _ in range(2000):
        n = 40
        cb, ca = (rng.randint(0, n) for _ in range(2))
        r = rng.randint(0, 3)
        rb = [rng.randint(0, n) for _ in range(r)]
        ra = [min(n, max(0, b + rng.randint(-3, 2))) for b in rb]
        delta, eps = Fraction(rng.randint(0, 4), n), Fraction(rng.randint(0, 2), n)
        got = performance_gate(cb / n, ca / n, [b / n for b in rb], [a / n for a in ra],
                               delta=float(delta), epsilon=float(eps)).outcome == "ship"
        want = slow_performance(Fraction(cb, n), Fraction(ca, n), [Fraction(b, n) for b in rb],
                                [Fraction(a, n) for a in ra], delta, eps)
        assert got == want


# ------------------------------------------------------------------------------- combine


def test_combine_modes():
    s_ok = seesaw_gate({"a": [False]}, {"a": [True]}, scope=["a"])
    s_no = seesaw_gate({"a": [True]}, {"a": [False]}, scope=["a"])
    p_ok = performance_gate(0.1, 0.2, [], [], delta=0.0, epsilon=0.0)
    p_no = performance_gate(0.2, 0.1, [], [], delta=0.0, epsilon=0.0)
    assert combine("seesaw", seesaw=s_ok)[:2] == ("ship", "seesaw")
    assert combine("performance", performance=p_no)[:2] == ("reject", "performance")
    assert combine("both", seesaw=s_ok, performance=p_ok)[:2] == ("ship", "seesaw+performance")
    assert combine("both", seesaw=s_ok, performance=p_no)[:2] == ("reject", "performance")
    assert combine("both", seesaw=s_no, performance=p_ok)[:2] == ("reject", "seesaw")
    assert combine("both", seesaw=s_no, performance=p_no)[:2] == ("reject", "seesaw+performance")
    assert combine("seesaw", seesaw=s_ok._replace(reason="fine")).reason == "fine"
    with pytest.raises(ValueError, match=r"one of \('seesaw', 'performance', 'both'\)"):
        combine("majority", seesaw=s_ok)
    with pytest.raises(ValueError, match="needs the result of \\['performance'\\]"):
        combine("both", seesaw=s_ok)



def turn_demo(question: str, expression: str, result: str) -> list[dict]:
    """A demonstration in the runtime's turn structure: task, tool call, tool result, answer."""
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % expression
    return [{"role": "user", "content": question}, {"role": "assistant", "content": call},
            {"role": "tool", "name": "calculator", "content": result},
            {"role": "assistant", "content": f"<answer>{result}</answer>"}]


def test_demonstration_turns_are_gated_like_any_added_text():
    """Every turn of a ``turns`` demonstration is added text (the tool's result too), with its role;
    a ground-truth answer in any of them leaks, and each new demonstration counts as an example."""
    demo = turn_demo("What is 1000 + 123456?", "1000 + 123456", "124456")
    insert = Edit("insert", "few_shot", spec={"kind": "few_shot", "name": "few_shot", "params": {"turns": demo}})
    segs = added_segments([insert], base_harness())
    assert [(s.param, s.role, s.text) for s in segs] == [("turns", t["role"], t["content"]) for t in demo]
    assert "124456" in edit_text([insert], base_harness())
    leaked = quality_gate([insert], base_harness(), {"t1": 124456}, {}, eta_leak=0.2, eta_bloat=5)
    assert not leaked.passed and leaked.leakage == 1.0 and "124456" in leaked.leaked
    # only the tool turn quotes it: an edit whose tool result differs does not leak
    other = [dict(t, content=t["content"].replace("124456", "7")) for t in demo]
    clean = Edit("insert", "few_shot", spec={"kind": "few_shot", "name": "few_shot", "params": {"turns": other}})
    assert quality_gate([clean], base_harness(), {"t1": 124456}, {}, eta_leak=0.2, eta_bloat=5).passed
    # bloat: six new demonstrations; adding one to a harness that shows five counts one
    six = [t for i in range(6) for t in turn_demo(f"What is {i} + {i}?", f"{i} + {i}", str(2 * i))]
    many = Edit("insert", "few_shot", spec={"kind": "few_shot", "name": "few_shot", "params": {"turns": six}})
    assert bloat([many], base_harness()).demos_added == 6
    assert not quality_gate([many], base_harness(), {}, {}, eta_leak=0.2, eta_bloat=5).passed
    five = apply_edit(base_harness(), Edit("insert", "few_shot", spec={"kind": "few_shot", "name": "few_shot",
                                                                       "params": {"turns": six[:20]}}))
    one_more = Edit("set_param", "few_shot", param="turns", value=six)
    assert bloat([one_more], five).demos_added == 1
    assert [s.text for s in added_segments([one_more], five)] == [t["content"] for t in six[20:]]
