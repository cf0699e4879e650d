//! What the interop programs in `src/bin/` share: the client runtime they run on, and
//! the PASS/FAIL tally they print.
use std::sync::Arc;

use rocketmq_client_rust::{ClientError, ClientResult, ClientRuntime, ClientRuntimeConfig};
use rocketmq_observability::TelemetryRuntimeGuard;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

/// The client runtime, with what must live as long as it.
pub struct Client {
    pub rt: Arc<ClientRuntime>,
    _owner: RuntimeOwner,
    _telemetry: TelemetryRuntimeGuard,
}

impl Client {
    pub fn start(thread_name: &str) -> ClientResult<Client> {
        let owner = RuntimeOwner::plan(RuntimeConfig {
            thread_name: thread_name.into(),
            ..Default::default()
        })
        .expect("runtime config")
        .build()
        .map_err(|e| ClientError::internal("runtime", e))?;
        let telemetry = rocketmq_observability::install_global(
            &rocketmq_observability::TelemetryBootstrapConfig::default(),
        )
        .map_err(|e| ClientError::internal("telemetry", e))?;
        let rt = ClientRuntime::try_new(
            owner.root_context().component("client"),
            ClientRuntimeConfig::default(),
            telemetry.handle(),
        )?;
        Ok(Client {
            rt,
            _owner: owner,
            _telemetry: telemetry,
        })
    }
}

/// Prints each check as PASS or FAIL and counts them.
#[derive(Default)]
pub struct Checks {
    passed: u32,
    failed: u32,
}

impl Checks {
    pub fn check(&mut self, name: &str, ok: bool, detail: String) {
        println!("{} {name}: {detail}", if ok { "PASS" } else { "FAIL" });
        if ok {
            self.passed += 1
        } else {
            self.failed += 1
        }
    }

    /// Prints the tally and exits: 0 when every check passed.
    pub fn exit(&self) -> ! {
        println!("{} passed, {} failed", self.passed, self.failed);
        std::process::exit(if self.failed == 0 { 0 } else { 1 });
    }
}
