//! Pins kept for other members of a cluster ([`strata_cache::BlockCache::set_member_pins`]): they pin the
//! blocks held here like this agent's own, are replaced as a whole per member, leave this agent's own pins
//! alone, and survive a restart.

use super::common::*;
use strata_cache::PolicyKind;
use strata_telemetry::Telemetry;

#[tokio::test]
async fn a_members_pins_pin_blocks_here_and_are_replaced_as_a_whole() {
    let dir = tempfile::tempdir().unwrap();
    let backend = memory_backend();
    let body = pattern(4 * 64 * 1024, 7);
    put(&backend, "ds/a.bin", &body).await;
    put(&backend, "own/b.bin", &pattern(2 * 64 * 1024, 8)).await;
    let cfg = || config(Some(dir.path()), 64, 2, 16, PolicyKind::Lru);
    let id = backend.id().to_string();
    {
        let cache = open(cfg(), Telemetry::new());
        cache.pin(&id, "own/").unwrap();
        for p in ["ds/", "own/"] {
            cache.warm(&ctx(), &backend, p, 2, |_| {}).await.unwrap();
        }
        let pinned = || cache.stats().disk.unwrap().pinned_bytes;
        assert_eq!(pinned(), 2 * 64 * 1024, "only the own pin so far");
        let r = cache
            .set_member_pins("http://10.0.0.2:7070", &[(id.clone(), "ds/".into())])
            .unwrap();
        assert_eq!(
            r.pinned_blocks, 4,
            "the member's pin pins the blocks held here"
        );
        assert_eq!(pinned(), 6 * 64 * 1024);
        assert_eq!(
            cache.own_pins().len(),
            1,
            "a member's pin is not this agent's own"
        );
        assert_eq!(
            cache.pinning_members(),
            vec!["http://10.0.0.2:7070".to_string()]
        );
        // The same list again changes nothing; another member pinning the same prefix is kept apart.
        let r = cache
            .set_member_pins("http://10.0.0.2:7070", &[(id.clone(), "ds/".into())])
            .unwrap();
        assert_eq!(r.pinned_blocks, 0);
        cache
            .set_member_pins("http://10.0.0.3:7070", &[(id.clone(), "ds/".into())])
            .unwrap();
        cache.set_member_pins("http://10.0.0.2:7070", &[]).unwrap();
        assert_eq!(
            pinned(),
            6 * 64 * 1024,
            "still covered by the other member's pin"
        );
        cache.shutdown().await;
    }
    // After a restart: the member's pin is still there, and removing it unpins; the own pin stays.
    let cache = open(cfg(), Telemetry::new());
    assert_eq!(
        cache.stats().disk.unwrap().pinned_bytes,
        6 * 64 * 1024,
        "re-pinned at start"
    );
    assert_eq!(
        cache.pinning_members(),
        vec!["http://10.0.0.3:7070".to_string()]
    );
    cache.set_member_pins("http://10.0.0.3:7070", &[]).unwrap();
    assert_eq!(cache.stats().disk.unwrap().pinned_bytes, 2 * 64 * 1024);
    assert!(cache.pinning_members().is_empty());
    assert_eq!(cache.stats().pins.len(), 1);
    cache.shutdown().await;
}
