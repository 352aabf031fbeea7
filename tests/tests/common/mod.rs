//! What the property test files share.

use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// A runner of `cases` cases (or `PROPTEST_CASES`), seeded, so that every run tries the same
/// inputs, and persisting nothing.
pub fn seeded_runner(cases: u32, seed: u8) -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    )
}
