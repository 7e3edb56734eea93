//! What a scenario run found: named checks, each passed or failed, and the exit code.

use std::process::ExitCode;
use std::time::Duration;

/// One check: a statement about an outcome, and whether it held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
}

/// The checks of one run, in order, and an error that stopped it early.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The checks made.
    pub checks: Vec<Check>,
    /// Why the run stopped before its end, if it did.
    pub error: Option<String>,
    /// How long the run took (printed, never checked).
    pub elapsed: Duration,
}

impl Report {
    /// Records a check and prints it.
    pub fn check(&mut self, name: impl Into<String>, passed: bool) -> bool {
        let name = name.into();
        println!("   {} {name}", if passed { "ok  " } else { "FAIL" });
        self.checks.push(Check { name, passed });
        passed
    }

    /// Whether the run ended and every check passed.
    pub fn passed(&self) -> bool {
        self.error.is_none() && !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }

    /// The checks that failed.
    pub fn failed(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| !c.passed)
    }

    /// The check whose name starts with `prefix`.
    pub fn find(&self, prefix: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name.starts_with(prefix))
    }

    /// Prints the summary.
    pub fn print_summary(&self) {
        let failed = self.failed().count();
        println!(
            "\n== {} checks: {} passed, {failed} failed (elapsed {:.2} s) ==",
            self.checks.len(),
            self.checks.len() - failed,
            self.elapsed.as_secs_f64()
        );
        for check in self.failed() {
            eprintln!("failed: {}", check.name);
        }
        if let Some(error) = &self.error {
            eprintln!("error: {error}");
        }
    }

    /// Success when [`Report::passed`], failure otherwise.
    pub fn exit_code(&self) -> ExitCode {
        if self.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}
