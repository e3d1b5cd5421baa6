//! Certificates for the LP bounds: a lower bound of an LP's optimum computed
//! from the LP's own numbers and any multipliers of its rows, so that a bound
//! the report prints does not rest on a solver's word that its point is
//! optimal; and a proof that an LP has no point at all.
//!
//! For `min cᵀx` subject to rows `aᵢᵀx ≤ bᵢ` (or `= bᵢ`) and `l ≤ x ≤ u`, any
//! multipliers `λ` with `λᵢ ≥ 0` on the `≤` rows give, for every feasible `x`,
//!
//! `cᵀx ≥ cᵀx + Σᵢ λᵢ (aᵢᵀx − bᵢ) = rᵀx − λᵀb ≥ −λᵀb + Σⱼ min(rⱼ lⱼ, rⱼ uⱼ)`,
//! with `r = c + Aᵀλ`
//!
//! (weak duality with the box kept: Neumaier and Shcherbina, "Safe bounds in
//! linear and mixed-integer linear programming", Math. Programming 99, 2004).
//! A solver's dual makes it tight; a poor one only makes it lower, never
//! wrong. The box may be any box that holds every feasible point: where a
//! variable has no upper bound of its own, one implied by the rows is used
//! ([`implied_upper`]); where none is implied and `rⱼ < 0`, the multipliers of
//! the rows that hold it down are lowered until `rⱼ ≥ 0` (a solver's `rⱼ` is
//! off by its tolerance, and one slightly below 0 on an unbounded variable
//! would make the bound −∞). With `c = 0` the same value above 0 proves that
//! no `x` meets the rows (a Farkas certificate).
//!
//! Arithmetic is in `f64`: the bound holds up to its rounding (about 1e-12 of
//! the sums' terms); implied bounds are padded by 1e-9 of their size.

/// A row: (coefficients by variable index, right-hand side, equality); a row
/// without `equality` is `≤`.
pub type Row = (Vec<(usize, f64)>, f64, bool);

/// An LP in the numbers its certificate needs: minimise `c · x` subject to
/// `rows` and `lo ≤ x ≤ hi`.
#[derive(Debug, Clone, Default)]
pub struct Form {
    /// Objective coefficients by variable.
    pub c: Vec<f64>,
    /// The objective's constant.
    pub c0: f64,
    pub lo: Vec<f64>,
    pub hi: Vec<f64>,
    pub rows: Vec<Row>,
}

/// Upper bounds of the variables that every point meeting the rows keeps:
/// each variable's own, and for a variable with a positive coefficient in a
/// row, the row's right-hand side less the least the row's other terms can
/// be (a few passes, so bounds found in one row tighten others).
pub fn implied_upper(f: &Form) -> Vec<f64> {
    let mut hi = f.hi.clone();
    for _ in 0..4 {
        let mut changed = false;
        for (a, b, _) in &f.rows {
            // The least value of each term, summed over the finite ones.
            let least = |j: usize, aij: f64, hi: &[f64]| if aij > 0.0 { aij * f.lo[j] } else { aij * hi[j] };
            let (mut sum, mut n_inf, mut inf_at) = (0.0, 0usize, usize::MAX);
            for &(j, aij) in a {
                let t = least(j, aij, &hi);
                if t.is_finite() {
                    sum += t;
                } else if aij != 0.0 {
                    n_inf += 1;
                    inf_at = j;
                }
            }
            for &(j, aij) in a {
                if aij <= 0.0 {
                    continue;
                }
                let own = least(j, aij, &hi);
                let rest = match (n_inf, own.is_finite()) {
                    (0, _) => sum - own,
                    (1, false) if inf_at == j => sum,
                    _ => continue,
                };
                let u = (b - rest) / aij;
                let u = u + 1e-9 * (1.0 + u.abs());
                if u.is_finite() && u < hi[j] {
                    hi[j] = u;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    hi
}

/// The lower bound of `f`'s optimum from the row multipliers `lambda` (one per
/// row; those of `≤` rows taken at least 0); with `with_objective` false, of
/// the LP with `c = 0` (a value above 0 proves `f` infeasible). `None` when
/// the multipliers give no finite bound (a variable without bounds on the
/// side its reduced cost points to, that no row's multiplier can correct).
pub fn dual_bound(f: &Form, lambda: &[f64], with_objective: bool) -> Option<f64> {
    if lambda.len() != f.rows.len() {
        return None;
    }
    let n = f.lo.len();
    let mut lam: Vec<f64> = lambda
        .iter()
        .zip(&f.rows)
        .map(|(&l, (_, _, eq))| {
            if !l.is_finite() {
                0.0
            } else if *eq {
                l
            } else {
                l.max(0.0)
            }
        })
        .collect();
    let hi = implied_upper(f);
    let mut r: Vec<f64> = if with_objective { f.c.clone() } else { vec![0.0; n] };
    r.resize(n, 0.0);
    let mut cols: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
    for (i, (a, _, _)) in f.rows.iter().enumerate() {
        for &(j, aij) in a {
            r[j] += aij * lam[i];
            cols[j].push((i, aij));
        }
    }
    // Coordinate steps on the multipliers: where a reduced cost points to a
    // far or missing bound (rⱼ < 0 times a large or infinite uⱼ), move one
    // multiplier of a row holding the variable so that rⱼ = 0, if that raises
    // the bound (computed exactly over the row). A solver's dual is off by its
    // tolerance, and times a bound of 10⁷ (a segment of delay work) a reduced
    // cost of −1e-6 costs 10 USD; on an unbounded variable the bound is −∞.
    let term = |k: usize, rk: f64| -> f64 {
        if rk > 0.0 {
            rk * f.lo[k]
        } else if rk < 0.0 {
            rk * hi[k]
        } else {
            0.0
        }
    };
    // (finite sum, infinite terms) of the terms of a row's variables, at r + a d.
    let row_terms = |i: usize, r: &[f64], d: f64| -> (f64, usize) {
        let (mut sum, mut inf) = (0.0, 0);
        for &(k, aik) in &f.rows[i].0 {
            let t = term(k, r[k] + aik * d);
            if t.is_finite() {
                sum += t;
            } else {
                inf += 1;
            }
        }
        (sum, inf)
    };
    for _ in 0..4 {
        let mut moved = false;
        for j in 0..n {
            let t = term(j, r[j]);
            if t.is_finite() && t > -1e-9 {
                continue;
            }
            // the best single row's step that makes rⱼ = 0
            let mut best: Option<(f64, usize, f64)> = None; // (gain, row, step)
            for &(i, aij) in &cols[j] {
                let mut d = -r[j] / aij;
                if !f.rows[i].2 && lam[i] + d < 0.0 {
                    d = -lam[i];
                }
                if d == 0.0 || !d.is_finite() {
                    continue;
                }
                let ((s0, i0), (s1, i1)) = (row_terms(i, &r, 0.0), row_terms(i, &r, d));
                let gain = match i1.cmp(&i0) {
                    std::cmp::Ordering::Less => f64::INFINITY,
                    std::cmp::Ordering::Greater => continue,
                    std::cmp::Ordering::Equal => s1 - s0 - d * f.rows[i].1,
                };
                if gain > 0.0 && best.is_none_or(|b| gain > b.0) {
                    best = Some((gain, i, d));
                }
            }
            if let Some((_, i, d)) = best {
                lam[i] += d;
                for &(k, aik) in &f.rows[i].0 {
                    r[k] += aik * d;
                }
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    let mut value = if with_objective { f.c0 } else { 0.0 };
    for (l, (_, b, _)) in lam.iter().zip(&f.rows) {
        value -= l * b;
    }
    for j in 0..n {
        let t = if r[j] > 0.0 {
            r[j] * f.lo[j]
        } else if r[j] < 0.0 {
            r[j] * hi[j]
        } else {
            0.0
        };
        if !t.is_finite() {
            return None;
        }
        value += t;
    }
    value.is_finite().then_some(value)
}

/// Whether `lambda` proves that `f` has no point: the bound of the LP with
/// `c = 0` above 0 by more than 1e-7 of the size of its terms.
pub fn proves_infeasible(f: &Form, lambda: &[f64]) -> bool {
    let scale: f64 = lambda.iter().zip(&f.rows).map(|(l, (_, b, _))| (l * b).abs()).sum();
    match dual_bound(f, lambda, false) {
        Some(v) => v > 1e-7 * (1.0 + scale),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// min x + 2y, x + y = 10 (row 0), x ≤ 4 (row 1), x, y ≥ 0: optimum 16 at
    /// (4, 6), duals λ = (−2, 1).
    fn small() -> Form {
        Form {
            c: vec![1.0, 2.0],
            c0: 0.0,
            lo: vec![0.0, 0.0],
            hi: vec![f64::INFINITY, f64::INFINITY],
            rows: vec![(vec![(0, 1.0), (1, 1.0)], 10.0, true), (vec![(0, 1.0)], 4.0, false)],
        }
    }

    #[test]
    fn the_optimal_duals_give_the_optimum_and_any_others_less() {
        let f = small();
        let at = |l: &[f64]| dual_bound(&f, l, true).unwrap();
        assert!((at(&[-2.0, 1.0]) - 16.0).abs() < 1e-6);
        // near-optimal duals as a solver returns them: a little below, never above
        let near = at(&[-2.0 + 1e-9, 1.0 - 1e-9]);
        assert!(near <= 16.0 + 1e-6 && near > 16.0 - 1e-4, "{near}");
        // poor multipliers: a lower bound still
        for l in [[0.0, 0.0], [-1.0, 0.0], [-3.0, 5.0], [5.0, 0.0], [-2.0, -7.0]] {
            let v = at(&l);
            assert!(v <= 16.0 + 1e-9, "{l:?} gave {v}");
        }
        // the implied bounds: x, y ≤ 10 from row 0, x ≤ 4 from row 1
        let hi = implied_upper(&f);
        assert!((hi[0] - 4.0).abs() < 1e-6 && (hi[1] - 10.0).abs() < 1e-6, "{hi:?}");
    }

    /// A variable no row bounds above, with a reduced cost a solver left a
    /// little below 0: the multiplier holding it is lowered, and the bound
    /// stays finite and valid.
    #[test]
    fn a_reduced_cost_below_zero_on_an_unbounded_variable_is_corrected() {
        // min y subject to x − y ≤ 0 (y ≥ x), x = 3 (x + 0y): optimum 3, λ = (1, −1)
        let f = Form {
            c: vec![0.0, 1.0],
            c0: 0.0,
            lo: vec![0.0, 0.0],
            hi: vec![f64::INFINITY, f64::INFINITY],
            rows: vec![(vec![(0, 1.0), (1, -1.0)], 0.0, false), (vec![(0, 1.0)], 3.0, true)],
        };
        let v = dual_bound(&f, &[1.0 + 1e-8, -1.0], true).unwrap();
        assert!(v <= 3.0 + 1e-9 && v > 3.0 - 1e-6, "{v}");
        let v = dual_bound(&f, &[1.0, -1.0], true).unwrap();
        assert!((v - 3.0).abs() < 1e-9, "{v}");
    }

    /// x + y ≤ 1 and x + y = 3 cannot both hold: λ = (1, −1) proves it; the
    /// feasible LP's multipliers prove nothing.
    #[test]
    fn a_farkas_vector_proves_no_point_exists() {
        let f = Form {
            c: vec![0.0, 0.0],
            c0: 0.0,
            lo: vec![0.0, 0.0],
            hi: vec![f64::INFINITY, f64::INFINITY],
            rows: vec![(vec![(0, 1.0), (1, 1.0)], 1.0, false), (vec![(0, 1.0), (1, 1.0)], 3.0, true)],
        };
        assert!(proves_infeasible(&f, &[1.0, -1.0]));
        assert!(!proves_infeasible(&f, &[0.0, 0.0]));
        assert!(!proves_infeasible(&small(), &[-2.0, 1.0]));
        // the wrong sign on a ≤ row is taken as 0: no proof
        assert!(!proves_infeasible(&f, &[-1.0, 1.0]));
    }

    /// Random small LPs (x = 0 feasible, boxes finite, so each has an
    /// optimum): any multipliers give a bound at most the optimum microlp
    /// finds, and prove no infeasibility. (That clarabel's give the optimum
    /// itself: the LP tests of tests/engine_sim.rs.)
    mod random {
        use super::super::*;
        use good_lp::{constraint, variable, Expression, ProblemVariables, Solution, SolverModel};
        use proptest::prelude::*;

        /// (objective, upper bounds, `≤` rows, multipliers)
        type Case = (Vec<f64>, Vec<f64>, Vec<(Vec<f64>, f64)>, Vec<f64>);

        fn lp() -> impl Strategy<Value = Case> {
            let n = 3usize;
            (
                proptest::collection::vec(-2.0..2.0f64, n),
                proptest::collection::vec(0.5..10.0f64, n),
                proptest::collection::vec((proptest::collection::vec(-3.0..3.0f64, n), 0.0..10.0f64), 1..5),
                proptest::collection::vec(-5.0..5.0f64, 5),
            )
        }

        proptest! {
            #[test]
            fn any_multipliers_bound_the_optimum((c, u, rows, lam) in lp()) {
                let mut vars = ProblemVariables::new();
                let xs: Vec<_> = u.iter().map(|&h| vars.add(variable().min(0.0).max(h))).collect();
                let obj: Expression = xs.iter().zip(&c).map(|(&x, &ci)| ci * x).sum();
                let mut p = vars.minimise(obj).using(good_lp::microlp);
                for (a, b) in &rows {
                    let e: Expression = xs.iter().zip(a).map(|(&x, &ai)| ai * x).sum();
                    p = p.with(constraint!(e <= *b));
                }
                let sol = p.solve().unwrap();
                let opt: f64 = xs.iter().zip(&c).map(|(&x, &ci)| ci * sol.value(x)).sum();
                let f = Form {
                    c: c.clone(),
                    c0: 0.0,
                    lo: vec![0.0; 3],
                    hi: u.clone(),
                    rows: rows.iter().map(|(a, b)| (a.iter().copied().enumerate().collect(), *b, false)).collect(),
                };
                let v = dual_bound(&f, &lam[..rows.len()], true).unwrap();
                prop_assert!(v <= opt + 1e-7 * (1.0 + opt.abs()), "bound {} above the optimum {}", v, opt);
                prop_assert!(!proves_infeasible(&f, &lam[..rows.len()]));
            }
        }
    }

    /// Without a lower bound on a variable whose reduced cost is positive and
    /// no row to correct it, there is no finite bound.
    #[test]
    fn no_bound_where_the_box_is_open() {
        let f = Form { c: vec![1.0], c0: 0.0, lo: vec![f64::NEG_INFINITY], hi: vec![f64::INFINITY], rows: vec![] };
        assert_eq!(dual_bound(&f, &[], true), None);
        assert_eq!(dual_bound(&small(), &[1.0], true), None, "one multiplier per row");
    }
}
