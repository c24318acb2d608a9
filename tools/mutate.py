"""Mutation check (`make mutate`): plant one named bug at a time in a copy of the repository and
run the tests that should catch it. A test run that fails kills the mutation; one that passes
lets it survive. Too slow for `make test` (a few minutes on 2 cores); run it after changing the
code around the maths or the tests that guard it.

Each mutation is (name, file, exact old text, new text, tests): that old text must occur exactly
once in the file (else the script stops, naming it: the code moved and the mutation must be
rewritten), the tests are pytest node ids or files. The set covers the stages' glue: data splits,
attention patterns, roles, agreement with the ablation, the claims, the training schedule and
significance, beside a few of the maths. The repository is never touched: the files git tracks
or would track (`git ls-files --cached --others --exclude-standard`) are copied into a temporary
directory, each mutation is written there and undone after its run, and the tests import that
copy (its path comes first; the check at start-up says so or stops). The unmutated copy must pass
every mapped test first, or every mutation would look killed.

    python tools/mutate.py                # every mutation; exit 1 below --min-score (0.9)
    python tools/mutate.py --list         # names and what each plants
    python tools/mutate.py NAME [NAME..]  # only these (e.g. after fixing a survivor)

Exit 2 when the set is stale: an old text not found exactly once, a mapped test that cannot run
(renamed, a collection error) or fails on the unmutated copy. Such a run is never counted as a kill.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300  # per mutation; a run that hangs counts as killed ("timeout")


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str  # the bug, in words
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


G = "tests/test_glue.py::"
HEADS = "tests/test_heads.py::"
COMPARE = "tests/test_compare.py::"
SIGNIFICANCE = "tests/test_significance.py::"
TRAIN = "tests/test_train.py::"
DATA = "tests/test_data.py::"
PATTERNS = "tests/test_patterns.py::"
COMPOSITION = "tests/test_composition.py::"
LEAK = DATA + "test_training_never_sees_a_held_out_token"
SCHEDULE = TRAIN + "test_every_parameter_group_follows_the_schedule_at_every_step"
CLAIMS = (
    COMPARE + "test_seed_statistics_claims_known_values",
    COMPARE + "test_claims_under_the_invariant_measure_known_values",
    COMPARE + "test_timing_through_training_known_values",
    G + "test_claims_a_and_d_take_the_worse_rotation",
    G + "test_claim_c_reads_its_effects_k_spearman_and_no_other_cell",
)
AGREEMENT = (
    HEADS + "test_spearman_known_answers_and_nan_safety",
    HEADS + "test_top_source_known_answers",
    HEADS + "test_causal_edges_exceed_their_batch_to_batch_spread",
    HEADS + "test_ranking_known_answers",
    HEADS + "test_ranking_reads_the_causal_edges_per_kind_and_measure",
    G + "test_spearman_and_top_source_rank_the_size_of_an_effect_not_its_sign",
    G + "test_a_tie_in_scores_makes_the_first_earlier_head_the_top_source",
    G + "test_an_edge_at_min_effect_and_beyond_its_one_sided_noise_is_causal",
    G + "test_each_effects_ranking_is_built_from_that_effect",
)
ROLES = (
    HEADS + "test_primary_role_nesting_roles_first_then_highest_score_and_nan_takes_none",
    HEADS + "test_planted_heads_get_their_roles",
    G + "test_a_score_at_its_threshold_takes_the_role_and_one_just_below_does_not",
)
PATTERN_TESTS = (
    PATTERNS + "test_one_hot_patterns_score_one_on_their_own_score_only",
    PATTERNS + "test_uniform_causal_pattern_has_the_closed_form_scores",
    PATTERNS + "test_induction_reads_the_token_after_the_earlier_copy",
    PATTERNS + "test_induction_averages_over_every_query_of_the_second_copy_and_no_other",
    PATTERNS + "test_duplicate_token_averages_over_queries_that_have_an_earlier_copy",
)
SIGNIFICANCE_TESTS = (
    SIGNIFICANCE + "test_conformal_p_counts_the_pool_at_or_above",
    SIGNIFICANCE + "test_benjamini_hochberg_known_answer",
    SIGNIFICANCE + "test_the_null_is_the_placebo_pairs_median_and_mad_per_family_floored_by_haars",
    SIGNIFICANCE + "test_the_calibrated_z_of_a_pair_does_not_depend_on_the_other_pairs_tested",
    SIGNIFICANCE + "test_the_null_p_is_conformal_up_to_the_top_fifth_then_its_exponential_tail",
    SIGNIFICANCE + "test_the_lone_pair_bar_is_where_the_null_p_reaches_fdr_over_m",
    SIGNIFICANCE
    + "test_later_pairs_are_tested_against_every_placebo_block_and_each_block_against_the_others",
    G + "test_a_pair_whose_q_equals_the_fdr_is_a_discovery",
)
HEADS_STAGE = (
    G + "test_qk_positivity_reads_the_best_k_source_when_it_is_not_head_0",
    G + "test_each_ablation_effect_comes_from_its_own_batch",
    HEADS + "test_planted_heads_get_their_roles",
    HEADS + "test_planted_copying_and_qk_positivity",
)

MUTATIONS = (
    # --- ten bugs in the stages' glue -------------------------------------------------------
    Mutation(
        "induction-skips-first-query",
        "the induction score skips the first query of the second copy",
        "pipeline/model/patterns.py",
        "length - 1, start=length + 1)",
        "length - 1, start=length + 2)",
        PATTERN_TESTS,
    ),
    Mutation(
        "role-threshold-exceeds",
        "a role is taken when its score exceeds (>) the threshold, not reaches it",
        "pipeline/behaviour/heads.py",
        "flag = table[score].ge(",
        "flag = table[score].gt(",
        ROLES,
    ),
    Mutation(
        "qk-source-by-q",
        "the QK-positivity source is the best Q composer, not the best K composer",
        "pipeline/behaviour/heads.py",
        "qk_positivity(hw, best_sources(scores))",
        'qk_positivity(hw, best_sources(scores, "Q"))',
        HEADS_STAGE,
    ),
    Mutation(
        "spearman-signed",
        "the agreement Spearman ranks signed effects, not their size",
        "pipeline/behaviour/agreement.py",
        'x, y = rows[effect].abs().to_numpy(float), rows["score"]',
        'x, y = rows[effect].to_numpy(float), rows["score"]',
        AGREEMENT,
    ),
    Mutation(
        "claim-c-worse-rotation",
        "claim (c) subtracts the worse rotation's agreement, not the better one's",
        "pipeline/compare/claims.py",
        'return _worst([_agreement(inp, v) for v in pair], "lower")',
        "return _worst([_agreement(inp, v) for v in pair])",
        CLAIMS,
    ),
    Mutation(
        "claim-b_inv-reads-true",
        "claim b_inv counts the true discoveries, not the invariant ones",
        "pipeline/compare/claims.py",
        'value = _cell_discoveries(seed.scored, INVARIANT, "induction"',
        'value = _cell_discoveries(seed.scored, "true", "induction"',
        CLAIMS,
    ),
    Mutation(
        "schedule-first-group-only",
        "the learning-rate schedule reaches the first parameter group only",
        "pipeline/model/train.py",
        "for group in opt.param_groups:",
        "for group in opt.param_groups[:1]:",
        (SCHEDULE,),
    ),
    Mutation(
        "tokens-source-leaks",
        "the token-file source trains on the first held-out token",
        "pipeline/data/datasets.py",
        "train = Stream(tokens[:cut], model.n_ctx, data.copies) if need_train else None\n    return Dataset(",
        "train = Stream(tokens[: cut + 1], model.n_ctx, data.copies) if need_train else None\n"
        "    return Dataset(",
        (LEAK,),
    ),
    Mutation(
        "text-source-leaks",
        "the text source trains on the first held-out token",
        "pipeline/data/datasets.py",
        "train = Stream(tokens[:cut], model.n_ctx, data.copies) if need_train else None\n    copies = ",
        "train = Stream(tokens[: cut + 1], model.n_ctx, data.copies) if need_train else None\n    copies = ",
        (LEAK,),
    ),
    Mutation(
        "constant-lr",
        "a constant learning rate: no warmup, no decay",
        "pipeline/model/train.py",
        'group["lr"] = lr_at(step, t)',
        'group["lr"] = t.lr',
        (SCHEDULE,),
    ),
    # --- data splits --------------------------------------------------------------------------
    Mutation(
        "synthetic-split-leaks",
        "the synthetic source trains on the last held-out sequence",
        "pipeline/data/datasets.py",
        "train = Rows(rows[n_held:])",
        "train = Rows(rows[n_held - 1 :])",
        (DATA + "test_synthetic_split_holds_out_the_first_sequences",),
    ),
    Mutation(
        "heldout-starts-in-training",
        "the token-file source's held-out stream starts one token early",
        "pipeline/data/datasets.py",
        '        manifest["copies"] = asdict(data.copies)\n    heldout = tokens[cut:]',
        '        manifest["copies"] = asdict(data.copies)\n    heldout = tokens[cut - 1 :]',
        (LEAK,),
    ),
    Mutation(
        "eval-windows-overlap",
        "held-out evaluation windows start one token apart (overlapping), not n_ctx apart",
        "pipeline/data/datasets.py",
        "heldout[i * n_ctx : (i + 1) * n_ctx]",
        "heldout[i : i + n_ctx]",
        (LEAK, DATA + "test_tokens_file_is_memory_mapped_with_a_manifest"),
    ),
    Mutation(
        "stream-skips-last-window",
        "a token stream never draws its last training window",
        "pipeline/data/datasets.py",
        "len(self.tokens) - self.n_ctx + 1, (size,)",
        "len(self.tokens) - self.n_ctx, (size,)",
        (LEAK,),
    ),
    Mutation(
        "probe-never-draws-the-last-span",
        "the induction probe never starts at the last possible held-out position",
        "pipeline/data/datasets.py",
        "torch.randint(0, len(heldout) - length, (n,)",
        "torch.randint(0, len(heldout) - length - 1, (n,)",
        (LEAK, DATA + "test_the_probe_repeats_held_out_spans_and_is_seeded"),
    ),
    # --- attention patterns -------------------------------------------------------------------
    Mutation(
        "first-token-counts-query-0",
        "the first-token score counts query 0, which has no other choice",
        "pipeline/model/patterns.py",
        "pattern[..., 1:, 0].mean(",
        "pattern[..., :, 0].mean(",
        PATTERN_TESTS,
    ),
    Mutation(
        "recent-window-short",
        "the recent window leaves out its farthest key",
        "pipeline/model/patterns.py",
        "for offset in range(1, k + 1))",
        "for offset in range(1, k))",
        PATTERN_TESTS,
    ),
    Mutation(
        "duplicate-counts-itself",
        "a query's own position counts as an earlier copy of its token",
        "pipeline/model/patterns.py",
        "torch.ones_like(same[0]).tril(-1)",
        "torch.ones_like(same[0]).tril(0)",
        PATTERN_TESTS,
    ),
    Mutation(
        "induction-on-heldout",
        "the heads stage reads induction off held-out text, not the probe",
        "pipeline/behaviour/heads.py",
        "patterns.induction(p_rep, length)",
        "patterns.induction(p_held, length)",
        HEADS_STAGE,
    ),
    # --- roles and the heads stage --------------------------------------------------------------
    Mutation(
        "first-roles-swapped",
        "induction outranks previous-token as the primary role",
        "pipeline/behaviour/heads.py",
        'FIRST = ("previous_token", "induction")',
        'FIRST = ("induction", "previous_token")',
        ROLES,
    ),
    Mutation(
        "heldout-effect-from-probe",
        "the held-out loss effect is read off the probe's ablation",
        "pipeline/behaviour/heads.py",
        'heldout_loss_effect=on_text["loss_effect"]',
        'heldout_loss_effect=on_probe["loss_effect"]',
        HEADS_STAGE,
    ),
    Mutation(
        "ablation-same-heldout-batch",
        "every ablation batch reads the first held-out batch",
        "pipeline/behaviour/heads.py",
        "dataset.eval[b * n : (b + 1) * n] for b in",
        "dataset.eval[0:n] for b in",
        (G + "test_analyse_ablates_each_held_out_batch_with_its_own_probe",),
    ),
    Mutation(
        "ablation-same-probe",
        "every ablation batch gets the probe of the first batch",
        "pipeline/behaviour/heads.py",
        "d_vocab, seed, batch=b)",
        "d_vocab, seed)",
        (G + "test_analyse_ablates_each_held_out_batch_with_its_own_probe",),
    ),
    Mutation(
        "placebo-reuses-clean-blocks",
        "a set's ablated pass reuses the clean output of every layer computed so far, not only of its first",
        "pipeline/behaviour/ablation.py",
        "out = model.blocks[layer](resid, pos, cache=True)",
        "out = clean_blocks[layer] if clean_blocks[layer:] else model.blocks[layer](resid, pos, cache=True)",
        ("tests/test_ablation.py::test_heads_loss_effects_of_many_sets_equal_each_set_alone",),
    ),
    Mutation(
        "placebo-p-counts-below",
        "the role's rank-test p counts the placebo sets below the role, not at or above it",
        "pipeline/behaviour/heads.py",
        "at_or_above = sum(x >= mine for x in theirs)",
        "at_or_above = sum(x < mine for x in theirs)",
        (HEADS + "test_role_ablation_reads_each_role_against_placebo_sets",),
    ),
    Mutation(
        "placebo-sets-exclude-the-role",
        "the placebo sets leave out the role's own heads (the rank test is then not exact)",
        "pipeline/behaviour/heads.py",
        "others = [s for s in every if s != sorted(heads)]",
        "others = [s for s in every if not set(s) & set(heads)]",
        (HEADS + "test_placebo_sets_known_answers",),
    ),
    # --- agreement with the ablation ------------------------------------------------------------
    Mutation(
        "top-source-signed",
        "top-source agreement picks the largest signed effect, not the largest size",
        "pipeline/behaviour/agreement.py",
        "assign(size=lambda f: f[effect].abs())",
        "assign(size=lambda f: f[effect])",
        AGREEMENT,
    ),
    Mutation(
        "causal-exceeds-min-effect",
        "an edge must exceed min_effect, not reach it, to be causal",
        "pipeline/behaviour/agreement.py",
        'out["causal"] = (out["mean"].to_numpy(float) >= min_effect)',
        'out["causal"] = (out["mean"].to_numpy(float) > min_effect)',
        AGREEMENT,
    ),
    Mutation(
        "causal-two-sided",
        "the causal t-test is two-sided (alpha / 2), not one-sided",
        "pipeline/behaviour/agreement.py",
        "student_t.ppf(1 - CAUSAL_ALPHA,",
        "student_t.ppf(1 - CAUSAL_ALPHA / 2,",
        AGREEMENT,
    ),
    Mutation(
        "pr-auc-ascending",
        "average precision walks the scores lowest first",
        "pipeline/behaviour/agreement.py",
        "for t in np.unique(score)[::-1]:",
        "for t in np.unique(score):",
        AGREEMENT,
    ),
    Mutation(
        "ranking-one-effect",
        "every effect's ranking is built from the probe's loss effect",
        "pipeline/behaviour/agreement.py",
        "ranking(causal_edges(batches, effect, min_effect), scores)",
        'ranking(causal_edges(batches, "loss_effect", min_effect), scores)',
        AGREEMENT,
    ),
    Mutation(
        "top-source-exceeds-min-effect",
        "top-source agreement counts a later head only when its largest effect exceeds min_effect",
        "pipeline/behaviour/agreement.py",
        'causal = causal[causal["size"] >= min_effect]',
        'causal = causal[causal["size"] > min_effect]',
        AGREEMENT,
    ),
    Mutation(
        "spearman-needs-four",
        "Spearman is left undefined with three pairs",
        "pipeline/behaviour/agreement.py",
        "if len(x) >= 3 and np.ptp(x)",
        "if len(x) > 3 and np.ptp(x)",
        AGREEMENT,
    ),
    Mutation(
        "top-source-ties-last",
        "among tied scores the top source is the last earlier head, not the first",
        "pipeline/behaviour/agreement.py",
        'sort_values([*DST, "src_layer", "src_head"], kind="stable")',
        'sort_values([*DST, "src_layer", "src_head"], kind="stable", ascending=False)',
        AGREEMENT,
    ),
    Mutation(
        "roc-auc-offset",
        "ROC-AUC subtracts the wrong rank-sum offset",
        "pipeline/behaviour/agreement.py",
        "n_pos * (n_pos + 1) / 2",
        "n_pos * (n_pos - 1) / 2",
        AGREEMENT,
    ),
    Mutation(
        "qk-source-by-errata-score",
        "the QK-positivity source is the best composer by the errata's score, not the true one",
        "pipeline/behaviour/heads.py",
        '(scores["variant"] == "true")].dropna(subset=["score"])',
        '(scores["variant"] == "errata_bcda")].dropna(subset=["score"])',
        HEADS_STAGE,
    ),
    # --- claims ---------------------------------------------------------------------------------
    Mutation(
        "claim-a-better-rotation",
        "claim (a) takes the more selective rotation, not the less",
        "pipeline/compare/claims.py",
        'yield Row("a", _worst([sel[v] for v in pair]) - sel["true"]',
        'yield Row("a", _worst([sel[v] for v in pair], "lower") - sel["true"]',
        CLAIMS,
    ),
    Mutation(
        "claim-d-better-rotation",
        "claim (d) holds when either rotation draws K edges only",
        "pipeline/compare/claims.py",
        'yield Row("d", _worst([only[v] for v in pair]), hypothesis=h)',
        'yield Row("d", _worst([only[v] for v in pair], "lower"), hypothesis=h)',
        CLAIMS,
    ),
    Mutation(
        "claim-m-every-kind",
        "claim (m) counts the discoveries of every kind, not K's",
        "pipeline/compare/claims.py",
        'm = _discoveries(scored, "true", kind) - _discoveries(scored, v, kind)',
        'm = _discoveries(scored, "true") - _discoveries(scored, v)',
        CLAIMS,
    ),
    Mutation(
        "claim-m_inv-reads-true",
        "claim m_inv counts the true discoveries, not the invariant ones",
        "pipeline/compare/claims.py",
        "m = _discoveries(seed.scored, INVARIANT, CLAIM_KIND)",
        'm = _discoveries(seed.scored, "true", CLAIM_KIND)',
        CLAIMS,
    ),
    Mutation(
        "claim-b-other-cell",
        "claim (b) counts induction <- previous_token, not <- recent_window",
        "pipeline/compare/claims.py",
        'value = _cell_discoveries(seed.scored, "true", "induction", "recent_window")',
        'value = _cell_discoveries(seed.scored, "true", "induction", "previous_token")',
        CLAIMS,
    ),
    Mutation(
        "claim-t-one-rotation-twice",
        "claim (t) measures against the same rotation in both of its rows",
        "pipeline/compare/claims.py",
        'yield Row("t", phases.clear_gap(steps, "true", v, fdr), kind=CLAIM_KIND, variant=v)',
        'yield Row("t", phases.clear_gap(steps, "true", ROTATIONS[0], fdr), kind=CLAIM_KIND, variant=v)',
        CLAIMS,
    ),
    Mutation(
        "claim-c-other-effect",
        "claim (c) reads another effect's agreement, not PRIMARY_EFFECT's",
        "pipeline/compare/claims.py",
        'inp.agreement.get(PRIMARY_EFFECT, {}).get("spearman", {})',
        'inp.agreement.get(next(e for e in inp.agreement if e != PRIMARY_EFFECT), {}).get("spearman", {})',
        CLAIMS,
    ),
    Mutation(
        "claim-c-other-kind",
        "claim (c) reads Q-composition's agreement, not K's",
        "pipeline/compare/claims.py",
        '.get("spearman", {}).get(CLAIM_KIND, {}).get(variant))',
        '.get("spearman", {}).get("Q", {}).get(variant))',
        CLAIMS,
    ),
    Mutation(
        "claim-c-pr-auc",
        "claim (c) compares PR-AUC at min_effect, not Spearman's rho over every pair",
        "pipeline/compare/claims.py",
        'return _number(inp.agreement.get(PRIMARY_EFFECT, {}).get("spearman", {})',
        'return _ranking(inp, PRIMARY_EFFECT, CLAIM_KIND, variant, "pr_auc") + 0 * _number('
        'inp.agreement.get(PRIMARY_EFFECT, {}).get("spearman", {})',
        CLAIMS,
    ),
    Mutation(
        "groups-max-z-calibrated",
        "groups.csv's max_z is the calibrated z, not the raw one",
        "pipeline/compare/stats.py",
        'max_z=("z", "max")',
        'max_z=("z_cal", "max")',
        (COMPARE + "test_group_composition_known_values", *CLAIMS),
    ),
    Mutation(
        "verdict-at-threshold",
        "a claim holds when its interval's lower end reaches the threshold, not exceeds it",
        "pipeline/compare/stats.py",
        'if stat["lo"] > limit and (x > limit).all():',
        'if stat["lo"] >= limit and (x > limit).all():',
        (COMPARE + "test_verdict", G + "test_a_verdict_needs_the_whole_interval_beyond_the_threshold"),
    ),
    Mutation(
        "seeds-holding-at-threshold",
        "a seed at the threshold counts as holding",
        "pipeline/compare/stats.py",
        '"seeds_holding": int((values > limit).sum()),',
        '"seeds_holding": int((values >= limit).sum()),',
        (COMPARE + "test_compare_across_seeds", G + "test_timing_figure_places_every_seeds_lag_and_mean"),
    ),
    Mutation(
        "compare-reads-scores-as-placebo",
        "the compare stage reads scores.csv as the placebo pairs",
        "pipeline/compare/read.py",
        'placebo=read_csv(composition / sub / "placebo.csv"',
        'placebo=read_csv(composition / sub / "scores.csv"',
        (G + "test_a_seeds_files_are_read_into_their_own_fields",),
    ),
    # --- dynamics ---------------------------------------------------------------------------------
    Mutation(
        "top-pair-source-in-its-layer",
        "the dynamics stage's previous-token source may sit in the induction head's own layer",
        "pipeline/behaviour/dynamics.py",
        'earlier = final_heads[final_heads["layer"] < dst["layer"]]',
        'earlier = final_heads[final_heads["layer"] <= dst["layer"]]',
        (G + "test_the_top_pairs_source_is_in_an_earlier_layer",),
    ),
    Mutation(
        "steps-induction-from-layer-0",
        "steps.tsv's induction score is the best of the early layers",
        "pipeline/behaviour/dynamics.py",
        'out["induction"] = late.groupby',
        'out["induction"] = early.groupby',
        ("tests/test_dynamics.py::test_steps_table_follows_the_top_pair",),
    ),
    # --- training -------------------------------------------------------------------------------
    Mutation(
        "decay-on-biases",
        "weight decay on the biases and LayerNorm, none on the matrices",
        "pipeline/model/train.py",
        '{"params": decay, "weight_decay": t.weight_decay}, {"params": rest, "weight_decay": 0.0}',
        '{"params": decay, "weight_decay": 0.0}, {"params": rest, "weight_decay": t.weight_decay}',
        (SCHEDULE,),
    ),
    Mutation(
        "gradients-cleared-after-backward",
        "gradients are cleared after backward: nothing is learned",
        "pipeline/model/train.py",
        "opt.zero_grad(set_to_none=True)\n        loss.backward()",
        "loss.backward()\n        opt.zero_grad(set_to_none=True)",
        (TRAIN + "test_a_tiny_model_learns_in_sixty_steps",),
    ),
    Mutation(
        "warmup-starts-at-zero",
        "warmup's first step has learning rate 0",
        "pipeline/model/train.py",
        "return t.lr * (step + 1) / t.warmup_steps",
        "return t.lr * step / t.warmup_steps",
        (TRAIN + "test_schedule_warms_up_linearly_then_decays_to_a_tenth", SCHEDULE),
    ),
    Mutation(
        "no-gradient-clipping",
        "gradients are not clipped",
        "pipeline/model/train.py",
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)\n",
        "",
        (SCHEDULE,),
    ),
    Mutation(
        "betas-swapped",
        "AdamW's betas are passed in the wrong order",
        "pipeline/model/train.py",
        "betas=(t.betas[0], t.betas[1])",
        "betas=(t.betas[1], t.betas[0])",
        (SCHEDULE,),
    ),
    Mutation(
        "curve-layers-swapped",
        "the curve's induction score is read off layer 0, its previous-token score off the last layer",
        "pipeline/model/train.py",
        "late, early = cache.pattern[1:] or cache.pattern, cache.pattern[:-1] or cache.pattern",
        "early, late = cache.pattern[1:] or cache.pattern, cache.pattern[:-1] or cache.pattern",
        (TRAIN + "test_evaluate_known_answers_on_the_planted_model",),
    ),
    Mutation(
        "induction-step-exceeds",
        "metrics' induction step is the first evaluation exceeding (>) the threshold, not reaching it",
        "pipeline/model/train.py",
        'curve.loc[curve["induction"] >= INDUCTION_THRESHOLD]',
        'curve.loc[curve["induction"] > INDUCTION_THRESHOLD]',
        (TRAIN + "test_induction_step_is_the_first_evaluation_reaching_the_threshold",),
    ),
    Mutation(
        "icl-sign-flipped",
        "the curve's in-context learning score is the first fifth's loss minus the last fifth's",
        "pipeline/model/train.py",
        "icl = loss[:, T - fifth :].mean() - loss[:, :fifth].mean()",
        "icl = loss[:, :fifth].mean() - loss[:, T - fifth :].mean()",
        (TRAIN + "test_evaluate_known_answers_on_the_planted_model", TRAIN + "test_curve_and_metrics"),
    ),
    # --- significance ---------------------------------------------------------------------------
    Mutation(
        "discovery-below-fdr",
        "a discovery needs q < fdr, not q <= fdr",
        "pipeline/circuits/significance.py",
        "discovery = np.isfinite(q) & (q <= fdr)",
        "discovery = np.isfinite(q) & (q < fdr)",
        SIGNIFICANCE_TESTS,
    ),
    Mutation(
        "bh-not-monotone",
        "BH's adjusted p-values without the running minimum",
        "pipeline/circuits/significance.py",
        "np.minimum(1.0, np.minimum.accumulate(ranked[::-1])[::-1])",
        "np.minimum(1.0, ranked)",
        SIGNIFICANCE_TESTS,
    ),
    Mutation(
        "conformal-p-without-plus-one",
        "the conformal p-value drops its +1s (p can be 0)",
        "pipeline/circuits/significance.py",
        "p = (1 + at_least) / (1 + len(pool))",
        "p = at_least / len(pool)",
        SIGNIFICANCE_TESTS,
    ),
    Mutation(
        "null-from-the-pairs-tested",
        "the later pairs are standardised by their own median and MAD, not the placebo pairs'",
        "pipeline/circuits/significance.py",
        "out = _tested(scores, standardised(scores, null), _pool(placebo, null), fdr)",
        "out = _tested(scores, standardised(scores, null_of(scores)), _pool(placebo, null), fdr)",
        SIGNIFICANCE_TESTS,
    ),
    Mutation(
        "null-without-haar-floor",
        "the placebo pairs' scale is not floored by the Haar null's",
        "pipeline/circuits/significance.py",
        "scale = HAAR_SCALE if math.isnan(scale) else max(scale, HAAR_SCALE)",
        "scale = HAAR_SCALE if math.isnan(scale) else scale",
        SIGNIFICANCE_TESTS,
    ),
    Mutation(
        "placebo-tested-against-itself",
        "each placebo block is tested against a null and pool that include itself",
        "pipeline/circuits/significance.py",
        "theirs = null_of(others)",
        "theirs = null_of(placebo)",
        SIGNIFICANCE_TESTS,
    ),
    Mutation(
        "bh-family-per-kind",
        "BH's family pools every measure of a kind, not one kind of one measure",
        "pipeline/circuits/significance.py",
        'FAMILY = ["kind", "variant"]',
        'FAMILY = ["kind"]',
        SIGNIFICANCE_TESTS,
    ),
    # --- the maths beside the glue --------------------------------------------------------------
    Mutation(
        "null-sd-biased",
        "the null's sd divides by n, not n - 1",
        "pipeline/circuits/scoring.py",
        "x.std(dim, correction=1 if x.shape[dim] > 1 else 0)",
        "x.std(dim, correction=0)",
        (
            COMPOSITION + "test_planted_composition_z_equals_explicitly_rotated_writers",
            COMPOSITION + "test_baselines_are_the_scores_of_gaussian_factors_drawn_from_the_seed",
        ),
    ),
)


def stop(problem: str) -> None:
    print(f"mutate: {problem}", file=sys.stderr)
    raise SystemExit(2)


def check_mutations(mutations: tuple[Mutation, ...]) -> None:
    """Every mutation's old text occurs exactly once, its new text differs; names are unique."""
    problems = []
    names = [m.name for m in mutations]
    problems += [f"{n}: named twice" for n in sorted({n for n in names if names.count(n) > 1})]
    for m in mutations:
        text = (ROOT / m.file).read_text()
        count = text.count(m.old)
        if count != 1:
            problems.append(f"{m.name}: its old text occurs {count} times in {m.file} (must be once)")
        if m.old == m.new:
            problems.append(f"{m.name}: old and new text are the same")
        if not m.tests:
            problems.append(f"{m.name}: no tests")
    if problems:
        stop("\n  ".join(["the mutation set does not match the code:", *problems]))


def copy_repository(dest: Path) -> None:
    """The files git tracks or would track (not ignored), nothing else: no venv, no outputs."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode()  # fmt: skip
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():  # a deleted file still listed by the index
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # one thread per test process: tiny tensors, and no oversubscription beside other jobs
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    return env


def require_imports_from(copy: Path) -> None:
    """The editable install maps `pipeline` to the repository: the copy must come first."""
    code = "import pipeline, stages; print(pipeline.__file__); print(stages.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=copy, env=environment(copy),
                         check=True, capture_output=True, text=True).stdout.split()  # fmt: skip
    if not all(Path(p).resolve().is_relative_to(copy.resolve()) for p in out):
        stop(f"the tests would import {out}, not the copy in {copy}")


def run_tests(copy: Path, tests: tuple[str, ...], stop_at_first: bool = True) -> tuple[int | None, str]:
    """(pytest's exit code, or None after TIMEOUT_S; its output's tail)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", "-o", "addopts="]
    cmd += ["-x"] if stop_at_first else []
    try:
        done = subprocess.run([*cmd, *tests], cwd=copy, env=environment(copy), capture_output=True, text=True,
                              timeout=TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, ""
    return done.returncode, (done.stdout + done.stderr)[-3000:]


def failed(output: str) -> str:
    """The first failing test named in pytest's short summary ("FAILED tests/x.py::test - ...")."""
    for line in output.splitlines():
        if line.startswith("FAILED "):
            return line.removeprefix("FAILED ").split(" - ")[0]
    return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="run only these mutations")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--min-score", type=float, default=0.9, help="killed fraction required (default 0.9)")
    args = parser.parse_args(argv)
    check_mutations(MUTATIONS)
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:34s} {m.file:28s} {m.what}")
        return 0
    unknown = sorted(set(args.names) - {m.name for m in MUTATIONS})
    if unknown:
        sys.exit(f"mutate: no mutation named {', '.join(unknown)} (--list names them)")
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attn-circuits-mutate-") as tmp:
        copy = Path(tmp) / "repo"
        copy_repository(copy)
        require_imports_from(copy)
        every = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        code, tail = run_tests(copy, every, stop_at_first=False)
        if code != 0:
            stop(f"the unmutated copy fails its mapped tests (pytest exit {code}):\n{tail}")
        print(f"unmutated: {len(every)} mapped tests pass ({time.perf_counter() - start:.0f} s)", flush=True)
        results = []
        for m in chosen:
            path = copy / m.file
            original = path.read_text()
            path.write_text(original.replace(m.old, m.new, 1))
            t0 = time.perf_counter()
            try:
                code, tail = run_tests(copy, m.tests)
            finally:
                path.write_text(original)
            outcome = {None: "killed (timeout)", 0: "SURVIVED", 1: "killed"}.get(code, f"ERROR (exit {code})")
            results.append((m, outcome))
            by = f"\n{'':18s}by {failed(tail)}" if code == 1 else ""
            print(f"{outcome:16s} {m.name:34s} {time.perf_counter() - t0:4.1f} s  {m.what}{by}", flush=True)
            if outcome.startswith("ERROR"):
                print(tail, file=sys.stderr)
    killed = sum(outcome.startswith("killed") for _, outcome in results)
    errors = [m.name for m, outcome in results if outcome.startswith("ERROR")]
    survivors = [m.name for m, outcome in results if outcome == "SURVIVED"]
    score = killed / len(results)
    seconds = time.perf_counter() - start
    print(f"\nscore: {killed} of {len(results)} mutations killed ({score:.0%}) in {seconds:.0f} s")
    if survivors:
        print("survived: " + ", ".join(survivors))
    if errors:  # a collection error or a missing test: the mapping is stale, not a kill
        print("errors (fix the mapping): " + ", ".join(errors))
        return 2
    return 0 if score >= args.min_score else 1


if __name__ == "__main__":
    sys.exit(main())
