"""`hf-xpress bench` end to end on tiny random models, the mismatch detector, the per-block micro-benchmark, the
speed-up decomposition, and the `evaluate` metric module (loaded offline from its folder)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
import torch

from hf_xpress import XPressDrafterModel, XPressStats
from hf_xpress.benchmarking import (
    PROMPT_LOOKUP_TOKENS, Method, _drafter_settings, _lookup_list, _method_from, _schedule_list, _optional_floats, block_latency, build_methods, format_block_table, run_benchmark,
    first_mismatch, ratio_interval, render_report, resummarize, select_methods, summarize,
)
from hf_xpress.assets import PromptRecord
from hf_xpress.cli import build_parser, main as cli_main

from conftest import tiny_drafter, tiny_target

REPO = Path(__file__).resolve().parent.parent
METRIC = REPO / "metrics" / "xpress_acceptance"


def _char_tokenizer():
    """A character-level tokenizer for the 128-token tiny vocabulary, with a chat template (ids < 127)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(32 + i): i for i in range(95)}
    vocab.update({"\n": 95, "<unk>": 96, "<eos>": 97})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return fast


@pytest.fixture(scope="module")
def llama():
    return tiny_target("llama")


def _prompt_file(tmp_path: Path) -> Path:
    path = tmp_path / "mine.jsonl"
    rows = [
        {"id": "p1", "prompt": "def add(a, b): return a + b"},
        {"messages": [{"role": "user", "content": "Hello there, tell me a story."}]},
        {"prompt": "1 2 3 4 5 6 7 8 9"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_cli_end_to_end_writes_json_markdown_and_plots(tmp_path, llama, capsys):
    target_dir, out = tmp_path / "target", tmp_path / "out"
    llama.save_pretrained(target_dir)
    _char_tokenizer().save_pretrained(target_dir)
    drafters = []
    for refiner in (None, "markov", "xpress"):
        folder = tmp_path / f"drafter-{refiner or 'dflash'}"
        tiny_drafter(llama, refiner).save_pretrained(folder)
        drafters += ["--drafter", str(folder)]
    assistant_dir = tmp_path / "assistant"
    tiny_target("llama", seed=5, num_hidden_layers=1).save_pretrained(assistant_dir)
    prompts = _prompt_file(tmp_path)

    assert "bench" in build_parser().format_help()
    rc = cli_main([
        "bench", "--target", str(target_dir), *drafters, "--assistant", str(assistant_dir),
        "--sets", str(prompts), "--limit", "2", "--max-new-tokens", "24", "--passes", "1,2",
        "--temperature", "0", "--temperature", "1", "--threads", "1", "--no-progress",
        "--block-latency", "--block-repeats", "1", "--block-context", "16", "--out", str(out), "--fail-on-mismatch",
    ])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results) >= {"meta", "methods", "summary", "mismatches", "runs", "block_latency"}
    names = [m["name"] for m in results["methods"]]
    assert names[:4] == ["plain", "prompt-lookup", "assisted[assistant]", "native-dflash"]
    assert {"dflash", "markov", "xpress K=1 es", "xpress K=1", "xpress K=2 es", "xpress K=2"} <= set(names)
    assert results["mismatches"] == []  # fp32: every greedy method is token-identical to plain generate
    assert results["meta"]["sets"] == {"mine": 2}
    for tkey in ("T=0", "T=1"):
        table = results["summary"][tkey]["all"]
        assert set(table) == set(names)
        assert table["plain"]["tau"] == 1.0 and table["plain"]["speedup"] == 1.0 and table["plain"]["t_step_ms"] > 0
        for name in names:
            figures = table[name]
            assert figures["tokens_per_s"] > 0 and 1.0 <= figures["tokens_per_forward"] <= 16
        xp = table["xpress K=2"]
        assert len(xp["slot_acceptance"]) == 15 and set(xp["per_round_ms"]) == {"draft", "refine", "verify", "other"}
        # K = 2 fixed passes; a one-slot round (cut by max_new_tokens) is final after one (locking)
        assert 1.5 < xp["mean_passes"] <= 2.0 and xp["decomposition"]["predicted_speedup"] > 0
        # the Markov head decodes every submitted slot: 15, fewer only in the rounds cut by max_new_tokens
        assert 1.0 < table["markov"]["mean_passes"] <= 15.0
    assert len(results["runs"]) == len(names) * 2 * 2
    assert "xpress K=" in results["headline"] and "tok/s" in results["headline"]
    report = (out / "report.md").read_text()
    for heading in ("Exactness", "Acceptance length tau", "Speed", "Latency split", "Per-slot acceptance",
                    "Per-block latency"):
        assert heading in report
    pngs = {p.name for p in out.glob("*.png")}
    for stem in ("tau", "slot_acceptance", "speedup", "latency_split", "refine_vs_k"):
        assert {f"{stem}_T0.png", f"{stem}_T1.png"} <= pngs
    assert "block_latency.png" in pngs
    assert all((out / p).stat().st_size > 1000 for p in pngs)

    # the fastest method and the fastest xPress setting (when another method is faster) against every other method
    table = results["summary"]["T=0"]["all"]
    leaders = [name for name in names if "over_others" in table[name]]
    fastest = max(names[1:], key=lambda name: table[name]["tokens_per_s"])
    best_xpress = max((n for n in names if n.startswith("xpress")), key=lambda name: table[name]["tokens_per_s"])
    assert set(leaders) == {fastest, best_xpress} and f"The fastest method, **{fastest}**" in report
    assert (f"The fastest xPress setting, **{best_xpress}**" in report) == (best_xpress != fastest)
    assert all(len(table[name]["over_others"]) == len(names) - 2 for name in leaders)

    # each xPress method against dFlash and the Markov head at the same submission settings, paired on the prompts
    for name in (n for n in names if n.startswith("xpress")):
        versus = table[name]["vs_same_settings"]
        assert set(versus) == {"dflash", "markov"}
        assert versus["markov"]["ratio"] == pytest.approx(table[name]["tokens_per_s"] / table["markov"]["tokens_per_s"])
        assert versus["dflash"]["tau_ratio"] == pytest.approx(table[name]["tau"] / table["dflash"]["tau"])
        assert versus["dflash"]["ci95"] is None  # 2 prompts: too few for an interval
    assert "xPress against the other drafters at the same settings" in report
    assert "vs_same_settings" not in table["markov"]

    # a saved run re-summarized by this version: nothing loaded or run, the same figures, a fresh report
    again = tmp_path / "again"
    assert cli_main(["bench", "--from-results", str(out / "results.json"), "--out", str(again)]) == 0
    redone = json.loads((again / "results.json").read_text())
    assert redone["runs"] == results["runs"] and redone["headline"] == results["headline"]
    assert redone["summary"]["T=0"]["all"]["xpress K=2"] == results["summary"]["T=0"]["all"]["xpress K=2"]
    assert redone["summary"] == results["summary"]
    assert (again / "report.md").read_text() == report.replace(str(out), str(again))
    broken = tmp_path / "broken.json"
    broken.write_text('{"runs": []}')
    assert cli_main(["bench", "--from-results", str(broken)]) == 2  # one line naming the problem
    assert "not a results.json written by `hf-xpress bench`" in capsys.readouterr().err


def test_mismatch_detector_flags_a_wrong_method(llama, capsys):
    def corrupt(target, ids, kwargs):
        out = target.generate(ids, **kwargs).clone()
        out[0, ids.shape[1] + 3] = (out[0, ids.shape[1] + 3] + 1) % 126
        return out

    methods = build_methods([("xp", tiny_drafter(llama, "xpress"))], passes=[2], early_stop=[True])
    methods.append(Method("broken", "custom", runner=corrupt))
    prompts = {"s": [[5, 6, 7, 8, 9, 10], [40, 41, 42]]}
    results = run_benchmark(llama, None, methods, prompts, max_new_tokens=12, progress=False, warmup=False)
    flagged = results["mismatches"]
    assert [m["method"] for m in flagged] == ["broken", "broken"]
    assert all(m["position"] == 3 and m["top2_logit_gap"] >= 0 and m["method_token_logit_gap"] >= 0 for m in flagged)
    assert all(m["gap_in_ulps"] >= 0 and isinstance(m["near_tie"], bool) for m in flagged)
    assert results["summary"]["T=0"]["all"]["broken"]["mismatches"] == 2
    assert results["summary"]["T=0"]["all"]["xpress K=2 es"]["mismatches"] == 0
    err = capsys.readouterr().err
    assert "MISMATCH" in err and "this is a bug" in err  # loud, and in float32 called a bug
    assert "greedy mismatches vs plain: 2" in results["headline"]
    # an output that stops early (or runs on) differs in length, not at a near-tie
    ids = torch.tensor([[5, 6, 7]])
    info = first_mismatch(llama, ids, [4, 9, 11], [4, 9])
    assert info["kind"] == "length" and info["position"] == 2 and info["near_tie"] is False
    assert info["reference_token"] == 11 and info["method_token"] is None and "top2_logit_gap" not in info
    assert first_mismatch(llama, ids, [4, 9, 11], [4, 8, 11])["kind"] == "token"

    def short(target, ids, kwargs):  # the same tokens, one fewer: reported (it crashed the run before)
        return target.generate(ids, **kwargs)[:, :-1]

    results = run_benchmark(llama, None, [methods[0], Method("short", "custom", runner=short)], {"s": [[5, 6, 7]]},
                            max_new_tokens=6, progress=False, warmup=False)
    assert [m["kind"] for m in results["mismatches"]] == ["length"]
    assert "short on s/0: the same tokens, but 5 new tokens against plain generate's 6" in capsys.readouterr().err
    with pytest.raises(ValueError, match="set 's' has prompts with the same id \\('dup'\\)"):
        run_benchmark(llama, None, methods, {"s": [PromptRecord("dup", "s", [{"role": "user", "content": "a"}], {}),
                                                  PromptRecord("dup", "s", [{"role": "user", "content": "b"}], {})]},
                      max_new_tokens=4, progress=False, warmup=False)


def test_headline_and_report_name_exactness_only_for_greedy_runs(llama):
    methods = build_methods([("xp", tiny_drafter(llama, "xpress"))], passes=[2], early_stop=[True])
    prompts = {"s": [[5, 6, 7, 8, 9, 10], [40, 41, 42], [7, 7, 7]]}
    sampled = run_benchmark(llama, None, methods, prompts, max_new_tokens=6, temperatures=(1.0,), progress=False,
                            warmup=False)
    assert "; no greedy runs" in sampled["headline"] and "mismatches" not in sampled["headline"]
    assert "No greedy runs: exactness is checked token for token on greedy outputs only." in render_report(sampled)
    both = run_benchmark(llama, None, methods, prompts, max_new_tokens=6, temperatures=(1.0, 0.0), progress=False,
                         warmup=False)
    assert "T=1" in both["headline"] and "greedy mismatches vs plain: 0" in both["headline"]
    saved = json.loads(json.dumps(both, default=str).replace("NaN", "null"))
    saved["runs"][0]["prefill_s"] = None  # JSON's NaN: a run without a target forward
    assert resummarize(saved)["summary"]["T=0"]["all"]


def test_drafts_per_round_and_confidence_variants_are_named_run_and_restored(llama):
    xp, mk = tiny_drafter(llama, "xpress"), tiny_drafter(llama, "markov")
    methods = build_methods([("xp", xp), ("mk", mk)], passes=[2], early_stop=[True], shortlists=[None, 8],
                            drafts=[None, 2], confidences=[0.0, 0.2], prompt_lookup=None, native_dflash=False)
    names = [m.name for m in methods]
    assert {"markov", "markov n2", "markov c0.2", "markov sl8 n2 c0.2", "xpress K=2 es n2", "xpress K=2 es sl8 c0.2"} <= set(names)
    assert len(names) == 1 + 2 * 2 * 4
    chosen = [m for m in methods if m.name in ("plain", "xpress K=2 es sl8 n2 c0.2", "markov n2")]
    results = run_benchmark(llama, None, chosen, {"s": [[5, 6, 7, 8, 9, 10]]}, max_new_tokens=20, progress=False,
                            warmup=False)
    assert results["mismatches"] == []
    runs = {r["method"]: r for r in results["runs"]}
    assert max(runs["markov n2"]["proposed"]) == 2 and max(runs["xpress K=2 es sl8 n2 c0.2"]["proposed"]) <= 2
    assert xp.config.num_assistant_tokens is None and xp.config.assistant_confidence_threshold == 0.0  # restored


def test_draft_count_schedule_variants_are_named_run_and_restored(llama):
    """`--schedule constant,cost`: chains run at each schedule (names carry " cost"), trees only at "constant"; the
    drafter's own schedule is restored after each run."""
    xp = tiny_drafter(llama, "xpress")
    methods = build_methods([("xp", xp)], passes=[2], early_stop=[True], drafts=[None, 4], schedules=["constant", "cost"],
                            prompt_lookup=None, native_dflash=False, trees=[None, 2])
    assert [m.name for m in methods] == ["plain", "xpress K=2 es", "xpress K=2 es cost", "xpress K=2 es n4",
                                         "xpress K=2 es n4 cost", "xpress K=2 es tree2", "xpress K=2 es n4 tree2"]
    assert len({m.settings_key() for m in methods[1:]}) == 6 and methods[4].describe()["schedule"] == "cost"
    results = run_benchmark(llama, None, [methods[0], methods[4]], {"s": [[5, 6, 7, 8, 9, 10]]}, max_new_tokens=30,
                            progress=False, warmup=False)
    assert results["mismatches"] == []
    run = next(r for r in results["runs"] if r["method"] == "xpress K=2 es n4 cost")
    assert run["proposed"][:2] == [4, 1] and max(run["proposed"]) <= 4  # its opening rounds, under the cap
    assert xp.config.num_assistant_tokens_schedule == "constant" and xp.config.num_assistant_tokens is None
    assert _method_from(methods[4].describe()).settings_key() == methods[4].settings_key()
    assert _schedule_list("constant, cost") == ["constant", "cost"]
    with pytest.raises(ValueError, match="--schedule takes comma-separated values of constant, heuristic, "):
        _schedule_list("constant,fast")


def test_draft_vocabulary_on_and_off_variants_run_and_restore(llama):
    xp, dfl = tiny_drafter(llama, "xpress"), tiny_drafter(llama, None)
    xp.set_draft_vocab(torch.arange(0, 128, 2))
    methods = build_methods([("xp", xp), ("df", dfl)], passes=[2], early_stop=[True], draft_vocabs=[True, False],
                            prompt_lookup=None, native_dflash=False)
    assert [m.name for m in methods] == ["plain", "xpress K=2 es", "xpress K=2 es allV", "dflash"]  # dFlash has none
    results = run_benchmark(llama, None, methods, {"s": [[5, 6, 7, 8, 9, 10]]}, max_new_tokens=20, progress=False,
                            warmup=False)
    assert results["mismatches"] == []
    drafted = {}
    for method in methods[1:3]:
        with _drafter_settings(method):
            llama.generate(torch.tensor([[5, 6, 7, 8, 9, 10]]), assistant_model=xp, max_new_tokens=20, do_sample=False)
        drafted[method.name] = {t for d in xp.stats.drafts for t in d}
    assert drafted["xpress K=2 es"] and all(t % 2 == 0 for t in drafted["xpress K=2 es"])
    assert any(t % 2 for t in drafted["xpress K=2 es allV"])  # the whole vocabulary was used
    assert xp.draft_vocab is not None and xp.config.draft_vocab_size == 64  # restored after the "allV" run
    assert [m.describe()["draft_vocab"] for m in methods[1:]] == [True, False, False]
    xp.config.refiner = "xpress"
    chosen = select_methods(build_methods([("xp", xp), ("df", dfl)], passes=[2], early_stop=[True], prompt_lookup=3,
                                          draft_vocabs=[True, False], native_dflash=False), "pld,xpress K=2 es allV")
    assert [m.name for m in chosen] == ["plain", "prompt-lookup", "xpress K=2 es allV"]
    assert [m.name for m in select_methods(methods, "xpress")] == ["plain", "xpress K=2 es", "xpress K=2 es allV"]
    with pytest.raises(ValueError, match="no method or kind named \\['markov sl64'\\]"):
        select_methods(methods, "markov sl64")


def test_our_methods_also_run_with_prompt_lookup_first(llama):
    xp = tiny_drafter(llama, "xpress")
    methods = build_methods([("xp", xp)], passes=[2], early_stop=[True], prompt_lookup=None, native_dflash=False,
                            with_lookup=[False, True])
    assert [m.name for m in methods] == ["plain", "xpress K=2 es", "xpress K=2 es +pld"]
    assert [m.describe()["prompt_lookup"] for m in methods[1:]] == [None, PROMPT_LOOKUP_TOKENS]
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
    results = run_benchmark(llama, None, methods, {"s": [prompt]}, max_new_tokens=30, progress=False, warmup=False)
    assert results["mismatches"] == []
    runs = {r["method"]: r for r in results["runs"]}
    assert not any(runs["xpress K=2 es"]["stats"]["lookup"])
    looked = runs["xpress K=2 es +pld"]["stats"]["lookup"]
    assert any(looked)
    figures = results["summary"]["T=0"]["all"]
    assert "lookup" not in figures["xpress K=2 es"]
    share = figures["xpress K=2 es +pld"]["lookup"]["share"]
    assert share == pytest.approx(sum(looked) / len(looked))
    assert f"| xpress K=2 es +pld | {share:.0%} |" in render_report(results)


def test_tree_variants_run_and_record_their_rounds(llama):
    xp, dfl = tiny_drafter(llama, "xpress"), tiny_drafter(llama, None)
    methods = build_methods([("xp", xp), ("df", dfl)], passes=[2], early_stop=[True], drafts=[2],
                            confidences=[0.0, 0.2], prompt_lookup=None, native_dflash=False, trees=[None, 3])
    names = [m.name for m in methods]
    assert names == ["plain", "xpress K=2 es n2", "xpress K=2 es n2 c0.2", "xpress K=2 es n2 tree3",
                     "dflash n2", "dflash n2 c0.2", "dflash n2 tree3"]  # a tree ignores the threshold: once
    assert [m.describe()["tree"] for m in methods[1:4]] == [None, None, 3]
    chosen = [methods[0], methods[1], methods[3]]
    results = run_benchmark(llama, None, chosen, {"s": [[5, 6, 7, 8, 9, 10], [3, 4]]}, max_new_tokens=20,
                            temperatures=(0.0, 1.0), progress=False)
    assert results["mismatches"] == []
    tree_runs = [r for r in results["runs"] if r["method"] == "xpress K=2 es n2 tree3"]
    assert sorted(r["temperature"] for r in tree_runs) == [0.0, 0.0, 1.0, 1.0]
    for r in tree_runs:  # every drafter round is recorded, and each costs one target forward (plus the prefill)
        assert len(r["accepted"]) == r["stats"]["rounds"] > 0 and max(r["proposed"]) == 2
        assert r["forwards"] == len(r["accepted"]) + 1 + (r["new_tokens"] - 1 - sum(r["accepted"]) - len(r["accepted"]))
    assert all("xpress K=2 es n2 tree3" in results["summary"][t]["all"] for t in ("T=0", "T=1"))
    assert build_methods([("xp", xp)], passes=[2], early_stop=[True], prompt_lookup=None, native_dflash=False,
                         trees=[2])[1].name == "xpress K=2 es tree2"  # trees only: no chain variant
    both = build_methods([("xp", xp)], passes=[2], early_stop=[True], prompt_lookup=None, native_dflash=False,
                         trees=[2], with_lookup=[False, True])
    assert [m.name for m in both] == ["plain", "xpress K=2 es tree2", "xpress K=2 es tree2 +pld"]
    assert both[2].generate_kwargs == {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
    dynamic = build_methods([("xp", xp)], passes=[2], early_stop=[True], prompt_lookup=None, native_dflash=False,
                            drafts=[3], trees=[None, 2], tree_budgets=[None, 5])
    assert [m.name for m in dynamic] == ["plain", "xpress K=2 es n3", "xpress K=2 es n3 tree2", "xpress K=2 es n3 tree2b5"]
    assert [(m.tree, m.tree_budget) for m in dynamic[1:]] == [(None, None), (2, None), (2, 5)]
    results = run_benchmark(llama, None, [dynamic[0], dynamic[3]], {"s": [[5, 6, 7, 8, 9, 10]]}, max_new_tokens=20,
                            temperatures=(0.0,), progress=False)
    assert results["mismatches"] == []
    run = next(r for r in results["runs"] if r["method"] == "xpress K=2 es n3 tree2b5")
    assert run["stats"]["rounds"] > 0 and max(run["proposed"]) == 3


def test_tree_methods_also_run_with_lookups_branch_in_the_tree(llama):
    xp = tiny_drafter(llama, "xpress")
    methods = build_methods([("xp", xp)], passes=[2], early_stop=[True], drafts=[2], prompt_lookup=None,
                            native_dflash=False, trees=[None, 2], tree_budgets=[4],
                            with_lookup=_lookup_list("off,on,branch"))
    assert [m.name for m in methods] == ["plain", "xpress K=2 es n2", "xpress K=2 es n2 +pld",  # no chain +pldb
                                         "xpress K=2 es n2 tree2b4", "xpress K=2 es n2 tree2b4 +pld",
                                         "xpress K=2 es n2 tree2b4 +pldb"]
    assert methods[5].generate_kwargs == {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS, "lookup_branch": True}
    assert methods[5].describe()["prompt_lookup"] == PROMPT_LOOKUP_TOKENS and methods[5].describe()["lookup_branch"]
    markov = build_methods([("mk", tiny_drafter(llama, "markov"))], drafts=[2], prompt_lookup=None, native_dflash=False,
                           trees=[2], tree_budgets=[4], with_lookup=["branch"])[1]
    assert markov.settings_key() == methods[5].settings_key() != methods[4].settings_key()
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
    results = run_benchmark(llama, None, [methods[0], methods[5]], {"s": [prompt]}, max_new_tokens=30,
                            progress=False, warmup=False)
    assert results["mismatches"] == []
    run = next(r for r in results["runs"] if r["method"] == "xpress K=2 es n2 tree2b4 +pldb")
    assert any(run["stats"]["lookup"]) and len(run["accepted"]) == run["stats"]["rounds"]
    with pytest.raises(argparse.ArgumentTypeError, match="off, on and branch"):
        _lookup_list("on,tree")


def test_dynamic_trees_also_run_at_each_tree_temperature(llama, monkeypatch):
    xp = tiny_drafter(llama, "xpress")
    methods = build_methods([("xp", xp)], passes=[2], early_stop=[True], drafts=[3], prompt_lookup=None,
                            native_dflash=False, trees=[None, 2], tree_budgets=[None, 4],
                            tree_temperatures=_optional_floats("none,1.5"))
    assert [m.name for m in methods] == ["plain", "xpress K=2 es n3", "xpress K=2 es n3 tree2",  # one each: T unused
                                         "xpress K=2 es n3 tree2b4", "xpress K=2 es n3 tree2b4 t1.5"]
    assert methods[3].settings_key() != methods[4].settings_key()
    assert methods[3].describe()["tree_temperature"] == 1.0 and methods[4].describe()["tree_temperature"] == 1.5
    assert "tree_temperature" not in methods[2].describe()
    assert [_method_from(m.describe()).tree_temperature for m in methods[3:]] == [None, 1.5]
    seen = []
    original = XPressDrafterModel.propose_dynamic_tree

    def propose(self, *args, **kwargs):
        seen.append(self.config.tree_temperature)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(XPressDrafterModel, "propose_dynamic_tree", propose)
    results = run_benchmark(llama, None, [methods[0], methods[4]], {"s": [[5, 6, 7, 8, 9, 10]]}, max_new_tokens=20,
                            progress=False, warmup=False)
    assert results["mismatches"] == [] and seen and set(seen) == {1.5}
    assert xp.config.tree_temperature == 1.0  # restored after the run
    with pytest.raises(ValueError, match=r"--tree-temperature takes positive numbers or none, got \[0.0\]"):
        _optional_floats("none,0")


@pytest.mark.parametrize("refiner", ["xpress", "markov", None])
def test_block_latency_positive_for_every_k(llama, refiner):
    drafter = tiny_drafter(llama, refiner)
    original = drafter.refiner
    r = block_latency(llama, drafter, context_length=24, new_context=3, repeats=2, warmup=1, verbose=False)
    assert drafter.refiner is original  # the swapped-in timing refiner is put back
    assert sorted(r["refine_ms"]) == list(range(0, 9))
    assert all(v > 0 for v in r["refine_ms"].values())
    keys = ("drafter_forward_ms", "lm_head_ms", "draft_ms", "markov_ms", "w2_read_ms", "verify_ms", "decode_step_ms")
    for key in keys:
        assert r[key] > 0, key
    assert set(r["goals"]) >= {"k4_below_markov", "k4_under_25pct_of_draft", "k4_in_round_over_markov"}
    goals = r["goals"]  # the goal's comparison: the two timed interleaved, call by call
    assert goals["k4_interleaved_ms"] > 0 and goals["markov_interleaved_ms"] > 0
    assert goals["k4_over_markov"] == goals["k4_interleaved_ms"] / goals["markov_interleaved_ms"]
    assert "Goal K=4 < Markov (the two interleaved call by call)" in format_block_table(r)
    assert all(r["in_round_ms"][name] > 0 for name in ("draft", "xpress_k4", "markov"))
    assert "K=4, in a round" in format_block_table(r) and "In a round (caches as in generation)" in format_block_table(r)
    assert r["block_size"] == 16


def test_in_round_timing_prepares_before_every_timed_call():
    from hf_xpress.benchmarking import _median_times_after

    log = []
    calls = {name: (lambda n=name: log.append(f"before {n}"), lambda n=name: log.append(n)) for name in ("a", "b")}
    times = _median_times_after(calls, "cpu", repeats=2, warmup=1)
    assert log == ["before a", "a", "before b", "b"] * 3
    assert set(times) == {"a", "b"} and all(t >= 0 for t in times.values())


def test_block_latency_also_times_the_compiled_refinement(llama):
    drafter = tiny_drafter(llama, "xpress", refiner_shortlist=8)
    r = block_latency(llama, drafter, passes=[4], context_length=8, repeats=2, warmup=1, verbose=False, compiled=True)
    assert set(r["refine_compiled_ms"]) == {4} and r["refine_compiled_ms"][4] > 0
    assert drafter._fast_refine is None  # compiled only for the measurement
    table = format_block_table(r)
    assert r["markov_compiled_ms"] > 0
    assert "K=4, shortlist 8, compiled" in table and "Both compiled (torch.compile): K=4" in table


@pytest.mark.parametrize("shortlist", [None, 8])
def test_block_latency_drafts_on_the_draft_vocabulary_like_generation(llama, shortlist):
    """With a draft vocabulary the timed round is generation's: base logits and every pass on its V' columns."""
    drafter = tiny_drafter(llama, "xpress", refiner_shortlist=shortlist)
    drafter.set_draft_vocab(torch.arange(0, 128, 4))
    r = block_latency(llama, drafter, passes=[1, 4], context_length=8, repeats=1, warmup=0, verbose=False,
                      compiled=True)
    assert r["sizes"]["vocab"] == 128 and r["sizes"]["draft_vocab"] == 32
    assert r["weights"]["lm_head"] == 32 * 64 and r["weights"]["w2_per_pass"] == 32 * drafter.config.refiner_rank
    assert r["refine_compiled_ms"][4] > 0 and r["markov_compiled_ms"] > 0
    table = format_block_table(r)
    assert "15 slots x V'=32" in table and "over 15 x V'=32 logits" in table and "V'=32 over 15 slots" in table


def test_block_latency_profiles_where_the_refiners_time_goes(llama):
    from hf_xpress.benchmarking import _profile_ops

    drafter = tiny_drafter(llama, "xpress", refiner_shortlist=8)
    r = block_latency(llama, drafter, passes=[4], context_length=8, repeats=2, warmup=0, verbose=False, profile=True)
    assert set(r["ops"]) == {"xpress_k4", "markov"}
    for prof in r["ops"].values():
        assert prof["total_us"] > 0 and 0 < len(prof["ops"]) <= 12
        assert all(name.startswith("aten::") and calls > 0 and us >= 0 for name, calls, us in prof["ops"])
        assert sum(us for _, _, us in prof["ops"]) <= prof["total_us"] * 1.0001
    table = format_block_table(r)
    assert "Where the time goes" in table and "| xPress K=4 | **all operators (profiled)** |" in table
    # per block: one SwiGLU per Jacobi pass (K = 4, early stop off); the Markov head one argmax per slot
    hidden = torch.randn(1, 16, llama.config.hidden_size)
    base = torch.randn(1, 15, llama.config.vocab_size)
    lead = torch.tensor([[3, 4]])
    calls = {name: calls for name, calls, _ in _profile_ops(
        lambda: drafter.propose(hidden, base, lead, passes=4, early_stop=False), repeats=3, top=100)["ops"]}
    assert calls["aten::silu"] == 4


def test_block_latency_builds_a_random_drafter(llama):
    r = block_latency(llama, None, context_length=8, repeats=1, warmup=0, verbose=False,
                      num_hidden_layers=1, refiner_rank=32, mask_token_id=127)
    assert r["sizes"]["drafter_layers"] == 1 and r["sizes"]["refiner_rank"] == 32


def _run(method, set_name, new, time_s, prefill, accepted=(), proposed=(), stats=None):
    return {"method": method, "set": set_name, "temperature": 0.0, "new_tokens": new, "time_s": time_s,
            "forwards": 1 + len(accepted) if accepted else new, "prefill_s": prefill,
            "accepted": list(accepted), "proposed": list(proposed), "stats": stats, "mismatch": None}


def test_summary_figures_and_decomposition_by_hand():
    methods = [Method("plain", "plain"), Method("xpress K=4", "xpress", passes=4, early_stop=False)]
    # plain: 11 tokens in 1.1 s with a 0.1 s prefill -> t_step = 0.1 s
    # xpress: 2 rounds accepting 3 and 5 drafts -> tau 5; per round draft 0.02, refine 0.01, verify 0.12 s
    stats = {"rounds": 2, "passes": [4, 4], "draft_time": 0.04, "refine_time": 0.02, "verify_time": 0.24}
    runs = [_run("plain", "s", 11, 1.1, 0.1),
            _run("xpress K=4", "s", 11, 0.44, 0.1, accepted=[3, 5], proposed=[15, 15], stats=stats)]
    table = summarize(runs, methods, [0.0], ["s"])["T=0"]["s"]
    xp = table["xpress K=4"]
    assert table["plain"]["t_step_ms"] == pytest.approx(100.0)
    assert xp["tau"] == 5.0 and xp["tokens_per_forward"] == pytest.approx(11 / 3)
    assert xp["speedup"] == pytest.approx(1.1 / 0.44)
    assert xp["slot_acceptance"][:6] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.0]
    assert xp["per_round_ms"]["draft"] == pytest.approx(20.0) and xp["per_round_ms"]["other"] == pytest.approx(20.0)
    d = xp["decomposition"]
    assert d["predicted_speedup"] == pytest.approx(5 * 100 / 150) and d["break_even_tau"] == pytest.approx(1.5)


def test_speedup_interval_resamples_prompts_in_pairs():
    def runs(times):  # (plain seconds, method seconds) per prompt, 10 tokens each
        out = []
        for i, (plain, mine) in enumerate(times):
            out += [_run("plain", "s", 10, plain, 0.0) | {"prompt_id": i}, _run("m", "s", 10, mine, 0.0) | {"prompt_id": i}]
        return out

    # the same 2x on every prompt: every resample gives 2x, however long each prompt takes
    assert ratio_interval(runs([(1.0, 0.5), (3.0, 1.5), (0.2, 0.1), (5.0, 2.5)]), "m") == pytest.approx([2.0, 2.0])
    # prompts that disagree: a wide interval around the point figure, narrower with more of the same prompts
    mixed = [(1.0, 0.5), (1.0, 1.0), (1.0, 0.8), (1.0, 0.4), (1.0, 0.9)]
    low, high = ratio_interval(runs(mixed), "m")
    point = 5.0 / sum(m for _, m in mixed)
    assert low < point < high and high - low > 0.3
    low4, high4 = ratio_interval(runs(mixed * 4), "m")
    assert low < low4 < point < high4 < high
    assert ratio_interval(runs(mixed[:2]), "m") is None  # too few prompts to say
    # resampled within each set: two sets, each the same on all its prompts (2x and 1x), leave no sampling spread
    two_sets = [r | {"set": "a"} for r in runs([(1.0, 0.5)] * 4)] + [r | {"set": "b"} for r in runs([(1.0, 1.0)] * 4)]
    assert ratio_interval(two_sets, "m") == pytest.approx([8 / 6, 8 / 6])
    table = summarize(runs(mixed), [Method("plain", "plain"), Method("m", "custom")], [0.0], ["s"])["T=0"]["all"]
    assert table["m"]["speedup_ci95"] == [low, high] and "speedup_ci95" not in table["plain"]

    # the fastest method against every other one, paired the same way
    rows = runs(mixed) + [_run("n", "s", 10, 0.7, 0.0) | {"prompt_id": i} for i in range(5)]
    methods = [Method("plain", "plain"), Method("m", "custom"), Method("n", "custom")]
    table = summarize(rows, methods, [0.0], ["s"])["T=0"]["all"]
    # m: 5 prompts in 3.6 s, n: in 3.5 s -> n is the fastest
    assert "over_others" not in table["m"] and set(table["n"]["over_others"]) == {"m"}
    assert table["n"]["over_others"]["m"]["ratio"] == pytest.approx(3.6 / 3.5)
    low, high = table["n"]["over_others"]["m"]["ci95"]
    assert low < 1.0 < high  # a lead within the prompts' spread


def test_report_sets_the_fastest_method_against_every_other(llama):
    import time as _time

    def runner(delay):
        def run(target, ids, kwargs):
            _time.sleep(delay)
            return target.generate(ids, **kwargs)
        return run

    methods = [Method("plain", "plain"), Method("quick", "custom", runner=runner(0.0)),
               Method("slow", "custom", runner=runner(0.2))]
    results = run_benchmark(llama, None, methods, {"s": [[5, 6, 7], [3, 4], [8, 9, 10, 11]]}, max_new_tokens=4,
                            progress=False, warmup=False)
    table = results["summary"]["T=0"]["all"]
    quick = table["quick"]
    assert set(quick["over_others"]) == {"slow"} and "over_others" not in table["slow"]
    low, high = quick["over_others"]["slow"]["ci95"]
    assert 1.0 < low <= quick["over_others"]["slow"]["ratio"] <= high
    assert quick["speedup_ci95"][0] <= quick["speedup"] <= quick["speedup_ci95"][1]
    report = render_report(results)
    assert "The fastest method, **quick**" in report and "xPress setting" not in report
    assert f"| slow | {quick['over_others']['slow']['ratio']:.3f}x | {low:.3f}-{high:.3f}x |" in report


def test_metric_module_loads_offline_and_matches_hand_values(monkeypatch):
    evaluate = pytest.importorskip("evaluate")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    metric = evaluate.load(str(METRIC))
    out = metric.compute(accepted=[3, 0, 15, 6], block_size=16)
    assert out["tau"] == 7.0 and out["mean_accepted"] == 6.0 and out["rounds"] == 4
    expected = [0.75] * 3 + [0.5] * 3 + [0.25] * 9  # slot k accepted in rounds with accepted >= k
    assert out["slot_acceptance"] == expected
    # the same numbers as the drafter's own stats
    stats = XPressStats(block_size=16, accepted=[3, 0, 15, 6])
    assert out["tau"] == stats.tau and out["slot_acceptance"] == stats.slot_acceptance()
    # incremental use and the acceptance rate
    metric.add_batch(accepted=[1, 2])
    metric.add(accepted=3)
    out = metric.compute(block_size=4, proposed=[3, 3, 3])
    assert out["tau"] == 3.0 and out["slot_acceptance"] == pytest.approx([1.0, 2 / 3, 1 / 3])
    assert out["acceptance_rate"] == pytest.approx(6 / 9)
    assert math.isnan(metric.compute(accepted=[], block_size=16)["tau"])
    with pytest.raises(ValueError, match="0..3"):
        metric.compute(accepted=[4], block_size=4)


def test_bench_rejects_bad_method_lists_before_loading_any_model(tmp_path, capsys):
    missing = str(tmp_path / "no-such-target")  # loading it would fail: the list errors must come first
    assert cli_main(["bench", "--target", missing, "--early-stop", "maybe"]) == 2
    assert "hf-xpress bench: error: --early-stop takes on,off (got 'maybe')" in capsys.readouterr().err
    assert cli_main(["bench", "--target", missing, "--tree-temperature", "0"]) == 2
    assert "--tree-temperature takes positive numbers or none" in capsys.readouterr().err


def test_metric_counts_drafting_rounds_like_the_bench_and_refuses_what_it_would_truncate(monkeypatch):
    """With `proposed`, prompt lookup's long rounds are accepted (the README says `drafter.stats` is the input) and
    every round still counts in tau, as in `drafter.stats.tau`; fractional or non-finite counts are refused, not
    truncated by the feature type."""
    evaluate = pytest.importorskip("evaluate")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    metric = evaluate.load(str(METRIC))
    out = metric.compute(accepted=[0, 18, 0, 14, 1, 10], proposed=[0, 30, 3, 30, 2, 30], block_size=16)
    assert out["rounds"] == 6 and out["tau"] == pytest.approx(1 + 43 / 6) and len(out["slot_acceptance"]) == 30
    assert out["acceptance_rate"] == pytest.approx(43 / 95)
    assert metric.compute(accepted=[0, 2], proposed=[0, 3], block_size=16)["tau"] == 2.0
    for bad, name in (({"accepted": [1.7, 2.2], "block_size": 4}, "accepted"), ({"accepted": [1], "block_size": 4.9},
                      "block_size"), ({"accepted": [None], "block_size": 4}, "accepted"),
                      ({"accepted": [1], "block_size": None}, "block_size"),
                      ({"accepted": [1], "proposed": [-1], "block_size": 4}, "proposed"),
                      ({"accepted": [1], "block_size": float("inf")}, "block_size"),
                      ({"accepted": [1], "proposed": [float("nan")], "block_size": 4}, "proposed")):
        with pytest.raises(ValueError, match=f"{name} takes non-negative whole numbers"):
            metric.compute(**bad)
    with pytest.raises(ValueError, match="need proposed="):
        metric.compute(accepted=[18], block_size=16)


def test_bench_checks_its_settings_before_loading_or_running(tmp_path, capsys):
    """Each before any model loads (the target does not exist): one line naming the flag, exit status 2."""
    missing = str(tmp_path / "no-such-target")
    afile = tmp_path / "afile"
    afile.write_text("")
    cases = [
        (["--shortlist", "0"], "--shortlist takes positive integers or none"),
        (["--shortlist", "-5"], "--shortlist takes positive integers or none"),
        (["--drafts", "0"], "--drafts takes positive integers or none"),
        (["--drafts", "abc"], "--drafts takes comma-separated ints or none"),
        (["--passes", "abc"], "--passes takes comma-separated integers"),
        (["--confidence", "x"], "--confidence takes comma-separated numbers"),
        (["--temperature", "-1"], "--temperature takes 0 (greedy) or a positive number"),
        (["--temperature", "nan"], "--temperature takes 0 (greedy) or a positive number"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--threads", "-1"], "--threads must be at least 0"),
        (["--block-context", "0"], "--block-context must be at least 8"),
        (["--block-repeats", "0"], "--block-repeats must be at least 1"),
        (["--device", "foo"], "--device 'foo': not a torch device"),
        (["--device", "meta"], "--device 'meta': this torch has no usable meta device"),  # was a traceback
        (["--tree-budget", "5"], "--tree-budget needs --tree W"),  # both ran chains only, silently
        (["--block-profile"], "--block-profile applies to the per-block benchmark"),  # was silently nothing
        (["--block-compiled"], "--block-compiled applies to the per-block benchmark"),
        (["--tree", "2", "--tree-temperature", "1.5"], "--tree-temperature ranks a dynamic tree's nodes"),
        *([(["--device", "cuda"], "--device 'cuda': this torch has no usable cuda device")]
          if not torch.cuda.is_available() else []),
        (["--sets", "humaneval,nosuchset"], "--sets: unknown prompt set 'nosuchset'"),
        (["--confidence", "0,1"], "--confidence takes thresholds in [0, 1)"),
        (["--passes", "2,-1"], "--passes takes integers >= 0"),
        (["--sets", str(tmp_path / "nowhere.jsonl")], f"--sets: {tmp_path / 'nowhere.jsonl'} is not a file"),
        (["--sets", "mtbench,math500,mtbench"], "--sets: mtbench is given twice"),
        (["--out", str(afile / "sub")], f"--out {afile / 'sub'}: cannot create the output folder"),
        # a helper's sweep: these ran without any method of ours, or named the wrong cause
        (["--passes", ""], "--passes needs at least one value, got ''"),
        (["--early-stop", ","], "--early-stop needs at least one value"),
        (["--passes", "1,1"], "--passes gives 1 more than once"),
        (["--shortlist", "none,64,none"], "--shortlist gives None more than once"),
        (["--temperature", "0.7", "--temperature", "0.7000001"], "are both reported as T=0.7"),
    ]
    for flags, message in cases:
        assert cli_main(["bench", "--target", missing, *flags]) == 2, flags
        assert message in capsys.readouterr().err, flags
    saved = REPO / "results" / "smollm2-bf16-dyn-lookup-24" / "results.json"  # a committed run
    assert cli_main(["bench", "--from-results", str(saved), "--out", str(afile / "sub")]) == 2
    assert "cannot create the output folder" in capsys.readouterr().err
    # --fail-on-mismatch fails a re-summarised run with greedy mismatches as it fails the run itself (was exit 0)
    bf16 = REPO / "results" / "qwen25coder-1.5b-2-short" / "results.json"  # a committed bf16 run: 2 mismatches
    assert cli_main(["bench", "--from-results", str(bf16), "--out", str(tmp_path / "again"), "--fail-on-mismatch"]) == 1
    assert cli_main(["bench", "--from-results", str(bf16), "--out", str(tmp_path / "again2")]) == 0


def test_bench_refuses_bad_folders_duplicate_sets_and_an_empty_run(tmp_path, llama, capsys):
    target_dir = tmp_path / "target"
    llama.save_pretrained(target_dir)
    _char_tokenizer().save_pretrained(target_dir)
    base = ["bench", "--target", str(target_dir), "--no-progress", "--threads", "1", "--max-new-tokens", "4",
            "--out", str(tmp_path / "out")]
    prompts = _prompt_file(tmp_path)
    (tmp_path / "other").mkdir()
    twin = tmp_path / "other" / "mine.jsonl"
    twin.write_text(prompts.read_text())
    builtin = tmp_path / "humaneval.jsonl"
    builtin.write_text(prompts.read_text())
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    drafter, dflash = tmp_path / "drafter", tmp_path / "dflash"
    tiny_drafter(llama, "xpress").save_pretrained(drafter)
    tiny_drafter(llama, None).save_pretrained(dflash)
    cases = [
        (["--drafter", str(tmp_path / "nowhere")], "--drafter " + str(tmp_path / "nowhere") + ": not a drafter folder"),
        (["--drafter", str(target_dir)], "holds a LlamaModel, not an xPress / dFlash drafter"),
        (["--assistant", str(tmp_path / "nowhere")], "--assistant " + str(tmp_path / "nowhere") + ": not a model folder"),
        (["--drafter", str(drafter), "--drafts", "100"], "--drafts 100: drafter drafts at most 15 tokens per round"),
        (["--sets", f"{prompts},{twin}"], "would be reported as 'mine', the name of another set given"),
        (["--sets", str(builtin)], "would be reported as 'humaneval', the name of a built-in set"),
        (["--sets", str(empty)], "no prompts to run"),
        (["--drafter", str(drafter), "--drafter", str(drafter), "--passes", "1", "--early-stop", "on"],  # names only
         "duplicate method names: ['xpress[drafter] K=1 es'] (the same drafter folder given twice"),     # the twins
        # settings no method reads: the run went on without them (a helper's sweep)
        (["--tree", "2"], "--tree applies to our drafters' methods, and no --drafter here is one"),
        (["--sets", str(prompts), "--drafter", str(dflash), "--passes", "2"],
         "--passes applies to xpress drafters' methods"),
        (["--sets", str(prompts), "--drafter", str(dflash), "--shortlist", "8"],
         "--shortlist applies to markov or xpress drafters' methods"),
        (["--sets", str(prompts), "--drafter", str(drafter), "--with-lookup", "branch"],
         "these settings leave no method of ours to run"),
    ]
    for flags, message in cases:
        assert cli_main([*base, *flags]) == 2, flags
        assert message in capsys.readouterr().err, flags


def test_a_run_replaces_an_earlier_runs_files_and_a_bad_results_file_changes_nothing(tmp_path, llama, capsys):
    """A second run into the same --out left the first run's T=1 plots beside its own figures; --from-results on a
    file the report cannot be made from crashed with a KeyError after rewriting results.json (a helper's sweep)."""
    target_dir, out = tmp_path / "target", tmp_path / "out"
    llama.save_pretrained(target_dir)
    _char_tokenizer().save_pretrained(target_dir)
    tiny_drafter(llama, "xpress").save_pretrained(tmp_path / "xp")
    base = ["bench", "--target", str(target_dir), "--drafter", str(tmp_path / "xp"), "--sets", str(_prompt_file(tmp_path)),
            "--limit", "1", "--max-new-tokens", "6", "--passes", "1", "--early-stop", "on", "--no-native-dflash",
            "--threads", "1", "--no-progress", "--out", str(out)]
    (out / "notes.txt").parent.mkdir(parents=True)
    (out / "notes.txt").write_text("mine")  # not ours: stays
    assert cli_main([*base, "--temperature", "0", "--temperature", "1"]) == 0
    assert {p.name for p in out.glob("*_T1.png")}
    assert cli_main([*base, "--temperature", "0"]) == 0
    assert not list(out.glob("*_T1.png")) and (out / "notes.txt").read_text() == "mine"
    assert not [p for p in out.iterdir() if p.name.startswith(".bench-")]  # the staging folder is gone
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    broken = json.loads((out / "results.json").read_text())
    del broken["meta"]["started"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    capsys.readouterr()
    assert cli_main(["bench", "--from-results", str(tmp_path / "broken.json"), "--out", str(out)]) == 2
    assert "a field the report reads is missing or malformed" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    broken = json.loads((out / "results.json").read_text())
    broken["runs"] = []
    (tmp_path / "empty.json").write_text(json.dumps(broken))
    assert cli_main(["bench", "--from-results", str(tmp_path / "empty.json"), "--out", str(out)]) == 2
    assert "holds no runs to summarise" in capsys.readouterr().err


def test_lookup_tokens_apply_to_our_lookup_methods_without_the_lookup_baseline(llama):
    methods = build_methods([("xp", tiny_drafter(llama, "xpress"))], passes=[1], early_stop=[True], prompt_lookup=3,
                            lookup_alone=False, native_dflash=False, with_lookup=[True])
    assert [m.name for m in methods] == ["plain", "xpress K=1 es +pld"]  # no prompt-lookup baseline
    assert methods[1].generate_kwargs["prompt_lookup_num_tokens"] == 3  # was the default 10


def test_prompt_tokens_equal_to_the_pad_id_are_not_masked(llama):
    """A target with neither a pad nor an EOS id is run with pad id 0; without an attention mask transformers masked
    every prompt token 0 (in the tests' character tokenizer: the space), so even the plain reference was wrong and
    tree methods refused the "padded" prompt."""
    from hf_xpress import benchmarking

    ids = torch.tensor([[5, 0, 7, 0, 9, 0, 11]])
    llama.generation_config.pad_token_id = llama.generation_config.eos_token_id = None
    out = llama.generate(ids, **benchmarking._generate_kwargs(llama, ids, 12, 0.0))
    unmasked = llama.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0, max_new_tokens=12, do_sample=False)
    masked = llama.generate(ids, pad_token_id=0, max_new_tokens=12, do_sample=False)
    assert torch.equal(out, unmasked) and not torch.equal(masked, unmasked)
