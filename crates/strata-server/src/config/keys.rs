//! An S3 access key of `[[gateway.keys]]` and who it stands for.

use serde::{Deserialize, Serialize};

/// One access key and who it stands for.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessKey {
    /// The access key id.
    pub access_key: String,
    /// The secret.
    pub secret_key: String,
    /// Principal name recorded in I/O events (default: the access key id).
    #[serde(default)]
    pub principal: Option<String>,
    /// Team the principal acts for.
    #[serde(default)]
    pub team: Option<String>,
    /// Job the key stands for (a key issued to one job): requests signed with it are attributed to this job
    /// unless they send an `x-strata-job` header.
    #[serde(default)]
    pub job: Option<String>,
}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessKey")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .field("principal", &self.principal)
            .field("team", &self.team)
            .field("job", &self.job)
            .finish()
    }
}
