"""Dominance with a tie tolerance: duplicates, near-ties, spread and infeasible points."""

import pytest

from apps.sweeps.frontier import Point, dominates, pareto_front


def test_a_clearly_better_point_dominates():
    assert dominates(Point("a", [1.0, 100.0]), Point("b", [2.0, 100.0]))
    assert not dominates(Point("b", [2.0, 100.0]), Point("a", [1.0, 100.0]))


def test_a_trade_off_is_not_dominance():
    a, b = Point("a", [1.0, 200.0]), Point("b", [2.0, 100.0])
    assert not dominates(a, b) and not dominates(b, a)
    assert pareto_front([a, b]) == ["a", "b"]


def test_differences_inside_the_tolerance_are_ties():
    a, b = Point("a", [1.00, 100.0]), Point("b", [1.01, 100.0])  # 1 % apart, base tolerance 2 %
    assert pareto_front([a, b], base=0.02) == ["a", "b"]
    assert pareto_front([a, b], base=0.0) == ["a"]  # without a tolerance the 1 % wins


def test_worse_within_tolerance_still_lets_a_clear_win_count():
    # a is 1 % worse on memory (a tie) and 50 % better on cost: a dominates b.
    assert dominates(Point("a", [1.0, 101.0]), Point("b", [2.0, 100.0]), base=0.02)


def test_measurement_spread_widens_the_tolerance():
    a, b = Point("a", [1.00, 100.0], spread=0.05), Point("b", [1.08, 100.0], spread=0.05)
    assert pareto_front([a, b], base=0.02) == ["a", "b"]  # 8 % apart < 5 % + 5 % spread
    quiet = [Point("a", [1.00, 100.0], spread=0.01), Point("b", [1.08, 100.0], spread=0.01)]
    assert pareto_front(quiet, base=0.02) == ["a"]


def test_duplicates_are_both_kept():
    assert pareto_front(
        [Point("a", [1.0, 5.0]), Point("b", [1.0, 5.0]), Point("c", [3.0, 6.0])]
    ) == ["a", "b"]


def test_infeasible_and_incomplete_points_are_never_on_the_frontier_nor_dominate():
    best_but_oom = Point("oom", [0.1, 1.0], feasible=False)
    missing = Point("nan", [None, 1.0])
    ok = Point("ok", [2.0, 50.0])
    assert pareto_front([best_but_oom, missing, ok]) == ["ok"]
    assert not dominates(best_but_oom, ok)


def test_mismatched_objectives_are_refused():
    with pytest.raises(ValueError):
        dominates(Point("a", [1.0]), Point("b", [1.0, 2.0]))


def test_three_objectives():
    pts = [Point(i, v) for i, v in enumerate([[1, 9, 5], [9, 1, 5], [5, 5, 1], [6, 6, 6]])]
    assert pareto_front(pts) == [0, 1, 2]


def test_the_cheapest_point_is_kept_when_a_near_tie_is_faster():
    # b is 1 % dearer (a tie at 2 %) and twice as fast: it dominates a, yet a is the cheapest probe.
    cheapest, faster = Point("a", [1.00, 10.0]), Point("b", [1.01, 5.0])
    assert dominates(faster, cheapest)
    assert pareto_front([cheapest, faster]) == ["a", "b"]


def test_the_best_on_each_objective_is_kept_and_an_exact_tie_goes_to_the_other_objectives():
    pts = [Point("slow", [1.0, 9.0]), Point("cheap", [1.0, 8.0]), Point("fast", [1.015, 1.0])]
    assert pareto_front(pts) == ["cheap", "fast"]
    assert pareto_front([Point("oom", [0.5, 1.0], feasible=False), *pts]) == ["cheap", "fast"]
