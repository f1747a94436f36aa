//! The seven seed fixtures of the admission contract
//! (`CONTRACT.md`), each checked against both admission forms:
//! the pure [`kvslots::admit`] and the atomic [`SlotCounter::admit`].
//!
//! The two known wrong ways are written here as small functions, and tests
//! prove that the fixtures catch each of them exactly where the contract says
//! they do, so the fixtures are known to be able to fail.

use kvslots::{admit, SlotCounter};

/// The `N` of the contract's fixture table.
const N: usize = 1;

/// One row of the contract's fixture table.
#[derive(Debug, Clone, Copy)]
struct Fixture {
    name: &'static str,
    capacity: usize,
    used: usize,
    requested: isize,
    admitted: usize,
}

const FITS_EXACTLY: Fixture = Fixture {
    name: "fits exactly",
    capacity: N + 3,
    used: N,
    requested: 3,
    admitted: 3,
};
const ONE_FREE_SHORT: Fixture = Fixture {
    name: "one free short",
    capacity: N + 3,
    used: N + 1,
    requested: 3,
    admitted: 0,
};
const PARTIAL_WOULD_FIT: Fixture = Fixture {
    name: "partial would fit",
    capacity: 5,
    used: 3,
    requested: 4,
    admitted: 0,
};
const EMPTY_APPEND: Fixture = Fixture {
    name: "empty append",
    capacity: 5,
    used: 3,
    requested: 0,
    admitted: 0,
};
const EMPTY_CACHE: Fixture = Fixture {
    name: "empty cache",
    capacity: N,
    used: 0,
    requested: N as isize,
    admitted: N,
};
const FULL_CACHE: Fixture = Fixture {
    name: "full cache",
    capacity: N,
    used: N,
    requested: 1,
    admitted: 0,
};
const NEGATIVE_REQUEST: Fixture = Fixture {
    name: "negative request",
    capacity: 5,
    used: 0,
    requested: -1,
    admitted: 0,
};

const ALL: [Fixture; 7] = [
    FITS_EXACTLY,
    ONE_FREE_SHORT,
    PARTIAL_WOULD_FIT,
    EMPTY_APPEND,
    EMPTY_CACHE,
    FULL_CACHE,
    NEGATIVE_REQUEST,
];

/// Checks one fixture against the pure fn and against a `SlotCounter` whose
/// `used` was set up by admitting first, including the state afterwards.
fn check(f: Fixture) {
    // The pure rule.
    assert_eq!(
        admit(f.capacity, f.used, f.requested),
        f.admitted,
        "kvslots::admit on fixture {:?}",
        f.name
    );

    // The atomic rule, from the same starting state.
    let counter = SlotCounter::new(f.capacity);
    if f.used > 0 {
        assert_eq!(
            counter.admit(f.used as isize),
            f.used,
            "setting up used for fixture {:?}",
            f.name
        );
    }
    assert_eq!(counter.used(), f.used, "setup of {:?}", f.name);
    let peak_before = counter.peak_used();

    let got = counter.admit(f.requested);
    assert_eq!(
        got, f.admitted,
        "SlotCounter::admit on fixture {:?}",
        f.name
    );
    assert_eq!(
        counter.used(),
        f.used + f.admitted,
        "used after fixture {:?}",
        f.name
    );
    assert_eq!(
        counter.available(),
        f.capacity - f.used - f.admitted,
        "available after fixture {:?}",
        f.name
    );
    assert!(!counter.is_closed());
    if f.admitted == 0 {
        // A refusal changes nothing, not even the high-water mark.
        assert_eq!(counter.used(), f.used, "refusal changed used: {:?}", f.name);
        assert_eq!(counter.peak_used(), peak_before, "refusal moved the peak");
    } else {
        assert_eq!(counter.peak_used(), f.used + f.admitted);
    }

    // Everything can be given back, to the last slot.
    counter.release(counter.used()).unwrap();
    assert_eq!(counter.used(), 0);
}

#[test]
fn fits_exactly() {
    check(FITS_EXACTLY);
}

#[test]
fn one_free_short() {
    check(ONE_FREE_SHORT);
}

#[test]
fn partial_would_fit() {
    check(PARTIAL_WOULD_FIT);
}

#[test]
fn empty_append() {
    check(EMPTY_APPEND);
}

#[test]
fn empty_cache() {
    check(EMPTY_CACHE);
}

#[test]
fn full_cache() {
    check(FULL_CACHE);
}

#[test]
fn negative_request() {
    check(NEGATIVE_REQUEST);
}

// ---------------------------------------------------------------------------
// The two known wrong ways, and proof that the fixtures catch them.
// ---------------------------------------------------------------------------

/// Wrong way 1, token by token: a request that does not fit still eats the
/// free slots that were left (`min(requested, capacity - used)`).
fn token_by_token(capacity: usize, used: usize, requested: isize) -> isize {
    let free = capacity.saturating_sub(used) as isize;
    requested.min(free)
}

/// Wrong way 2, against total capacity: ignores the slots already used.
fn against_total_capacity(capacity: usize, _used: usize, requested: isize) -> isize {
    if requested <= capacity as isize {
        requested
    } else {
        0
    }
}

/// The names of the fixtures `rule` gets wrong, with what it admits there.
fn failures(rule: fn(usize, usize, isize) -> isize) -> Vec<(&'static str, isize)> {
    ALL.iter()
        .filter_map(|f| {
            let got = rule(f.capacity, f.used, f.requested);
            (got != f.admitted as isize).then_some((f.name, got))
        })
        .collect()
}

#[test]
fn fixtures_catch_token_by_token() {
    assert_eq!(
        failures(token_by_token),
        vec![
            ("one free short", 2),
            ("partial would fit", 2),
            ("negative request", -1),
        ]
    );
}

#[test]
fn fixtures_catch_against_total_capacity() {
    assert_eq!(
        failures(against_total_capacity),
        vec![
            ("one free short", 3),
            ("partial would fit", 4),
            ("full cache", 1),
            ("negative request", -1),
        ]
    );
}

#[test]
fn correct_rule_fails_no_fixture() {
    fn correct(capacity: usize, used: usize, requested: isize) -> isize {
        admit(capacity, used, requested) as isize
    }
    assert_eq!(failures(correct), vec![]);
}

// ---------------------------------------------------------------------------
// Edge cases of the pure fn.
// ---------------------------------------------------------------------------

#[test]
fn pure_used_above_capacity_admits_nothing() {
    assert_eq!(admit(1, 2, 1), 0);
    assert_eq!(admit(0, 1, 1), 0);
    assert_eq!(admit(10, 11, 1), 0);
    assert_eq!(admit(10, usize::MAX, 1), 0);
    assert_eq!(admit(10, usize::MAX, isize::MAX), 0);
    assert_eq!(admit(usize::MAX - 1, usize::MAX, 1), 0);
}

#[test]
fn pure_usize_max_capacity() {
    assert_eq!(admit(usize::MAX, 0, isize::MAX), isize::MAX as usize);
    assert_eq!(admit(usize::MAX, 0, 1), 1);
    assert_eq!(admit(usize::MAX, usize::MAX, 1), 0);
    assert_eq!(admit(usize::MAX, usize::MAX - 1, 1), 1);
    assert_eq!(admit(usize::MAX, usize::MAX - 1, 2), 0);
    // Exactly isize::MAX free, then one fewer.
    let used = usize::MAX - isize::MAX as usize;
    assert_eq!(admit(usize::MAX, used, isize::MAX), isize::MAX as usize);
    assert_eq!(admit(usize::MAX, used + 1, isize::MAX), 0);
    assert_eq!(admit(usize::MAX, 0, -1), 0);
    assert_eq!(admit(usize::MAX, 0, 0), 0);
}

#[test]
fn pure_isize_extremes() {
    assert_eq!(admit(5, 0, isize::MAX), 0);
    assert_eq!(admit(5, 0, isize::MIN), 0);
    assert_eq!(admit(0, 0, isize::MIN), 0);
    assert_eq!(admit(usize::MAX, 0, isize::MIN), 0);
    assert_eq!(admit(5, 0, isize::MIN + 1), 0);
    assert_eq!(
        admit(isize::MAX as usize, 0, isize::MAX),
        isize::MAX as usize
    );
    assert_eq!(admit(isize::MAX as usize - 1, 0, isize::MAX), 0);
}

#[test]
fn pure_zero_capacity() {
    assert_eq!(admit(0, 0, 1), 0);
    assert_eq!(admit(0, 0, 0), 0);
    assert_eq!(admit(0, 0, -1), 0);
}

#[test]
fn pure_is_const() {
    // Evaluated at compile time: the rule is usable in const contexts.
    const ADMITTED: usize = admit(4, 1, 3);
    const REFUSED: usize = admit(4, 2, 3);
    assert_eq!((ADMITTED, REFUSED), (3, 0));
}

#[test]
fn pure_matches_counter_exhaustively_small() {
    // Every (capacity, used, requested) in a small box: the atomic rule
    // agrees with the pure one, and a refusal leaves the counter unchanged.
    for capacity in 0..=6usize {
        for used in 0..=capacity {
            for requested in -3isize..=8 {
                let expected = admit(capacity, used, requested);
                assert!(expected == 0 || expected == requested as usize);
                let counter = SlotCounter::new(capacity);
                if used > 0 {
                    assert_eq!(counter.admit(used as isize), used);
                }
                assert_eq!(
                    counter.admit(requested),
                    expected,
                    "capacity {capacity}, used {used}, requested {requested}"
                );
                assert_eq!(counter.used(), used + expected);
                assert!(counter.used() <= counter.capacity());
            }
        }
    }
}

#[test]
fn counter_at_max_capacity_admits_isize_max() {
    // MAX_CAPACITY is the largest count the state word can hold.
    let counter = SlotCounter::new(SlotCounter::MAX_CAPACITY);
    assert_eq!(
        counter.admit(isize::MAX),
        admit(SlotCounter::MAX_CAPACITY, 0, isize::MAX)
    );
    assert_eq!(counter.used(), isize::MAX as usize);
    assert_eq!(
        counter.available(),
        SlotCounter::MAX_CAPACITY - isize::MAX as usize
    );
    assert_eq!(
        counter.admit(1),
        admit(SlotCounter::MAX_CAPACITY, isize::MAX as usize, 1)
    );
    assert_eq!(counter.admit(isize::MIN), 0);
    counter.release(isize::MAX as usize).unwrap();
    assert_eq!(counter.used(), 0);
    assert!(!counter.is_closed());
}
