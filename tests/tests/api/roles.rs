//! A group's admins and slow mode (docs/api.md §25, §26): who may set what, the bounds, and a
//! slow mode that refuses a member's second send within its period and never stores it later.

use chat_tests::{new_uuid, seqs, unique_users, Resp, TestApp};
use serde_json::json;
use std::time::Duration;

async fn set_slow_mode(
    t: &TestApp,
    c: &str,
    user: &str,
    seconds: impl Into<serde_json::Value>,
) -> Resp {
    let body = json!({"slowModeSeconds": seconds.into()}).to_string();
    t.call(
        "PATCH",
        &format!("/conversations/{c}"),
        Some(user),
        Some(&body),
    )
    .await
}

async fn admin(t: &TestApp, c: &str, by: &str, user: &str, add: bool) -> Resp {
    let method = if add { "PUT" } else { "DELETE" };
    t.call(
        method,
        &format!("/conversations/{c}/admins/{user}"),
        Some(by),
        None,
    )
    .await
}

#[track_caller]
fn assert_status(r: &Resp, status: u16, code: &str) {
    assert_eq!((r.status, r.code()), (status, code), "{r:?}");
}

#[tokio::test]
async fn only_the_owner_names_admins_and_managers_set_slow_mode() {
    let t = TestApp::new().await;
    let u = unique_users(4);
    let (owner, m1, m2, stranger) = (&u[0], &u[1], &u[2], &u[3]);
    let c = t.group(owner, &[m1, m2]).await;
    // Admins: the owner only; a member to be named; a direct conversation has none.
    assert_status(&admin(&t, &c, m1, m2, true).await, 403, "forbidden");
    assert_status(
        &admin(&t, &c, owner, stranger, true).await,
        404,
        "not_found",
    );
    assert_status(&admin(&t, &c, stranger, m1, true).await, 404, "not_found");
    let d = t.direct(owner, m1).await;
    assert_status(&admin(&t, &d, owner, m1, true).await, 409, "conflict");
    let named = admin(&t, &c, owner, m2, true).await;
    assert_eq!(
        (named.status, &named.body["admins"]),
        (200, &json!([m2])),
        "{named:?}"
    );
    let again = admin(&t, &c, owner, m2, true).await;
    assert_eq!(again.body["admins"], json!([m2]), "idempotent");
    // Slow mode: managers; 0-120; groups only.
    assert_status(&set_slow_mode(&t, &c, m1, 10).await, 403, "forbidden");
    assert_status(&set_slow_mode(&t, &c, stranger, 10).await, 404, "not_found");
    for bad in [json!(121), json!(-1), json!("5"), json!(1.5)] {
        assert_status(
            &set_slow_mode(&t, &c, owner, bad).await,
            400,
            "invalid_request",
        );
    }
    assert_status(&set_slow_mode(&t, &d, owner, 10).await, 409, "conflict");
    let set = set_slow_mode(&t, &c, m2, 30).await;
    assert_eq!(
        (set.status, &set.body["slowModeSeconds"]),
        (200, &json!(30)),
        "{set:?}"
    );
    let seen = t.get(&format!("/conversations/{c}"), m1).await;
    assert_eq!(
        (&seen.body["slowModeSeconds"], &seen.body["admins"]),
        (&json!(30), &json!([m2]))
    );
    // Removed, the admin may no longer set it.
    let removed = admin(&t, &c, owner, m2, false).await;
    assert_eq!(
        (removed.status, removed.body.get("admins")),
        (200, None),
        "{removed:?}"
    );
    assert_status(&set_slow_mode(&t, &c, m2, 0).await, 403, "forbidden");
    let off = set_slow_mode(&t, &c, owner, 0).await;
    assert_eq!(
        (off.status, off.body.get("slowModeSeconds")),
        (200, None),
        "{off:?}"
    );
}

#[tokio::test]
async fn slow_mode_lets_a_member_send_once_per_period_and_exempts_managers() {
    let t = TestApp::new().await;
    let u = unique_users(3);
    let (owner, member, admin_user) = (&u[0], &u[1], &u[2]);
    let c = t.group(owner, &[member, admin_user]).await;
    assert_eq!(admin(&t, &c, owner, admin_user, true).await.status, 200);
    assert_eq!(set_slow_mode(&t, &c, owner, 2).await.status, 200);
    let first = new_uuid();
    assert_eq!(t.send_with_id(&c, member, &first, "one").await.status, 201);
    let refused_id = new_uuid();
    let refused = t.send_with_id(&c, member, &refused_id, "two").await;
    assert_status(&refused, 429, "slow_mode");
    let after: u64 = refused.headers["retry-after"].parse().unwrap();
    assert!((1..=2).contains(&after), "{refused:?}");
    // A retry of the stored send is still answered.
    let replay = t.send_with_id(&c, member, &first, "one").await;
    assert_eq!(
        (replay.status, &replay.body["seq"]),
        (200, &json!(1)),
        "{replay:?}"
    );
    // The owner and the admin are exempt.
    for who in [owner, owner, admin_user, admin_user] {
        assert_eq!(t.send(&c, who, "managers").await.status, 201);
    }
    // Next period: the member sends again; the refused send was never stored.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let next = t.send_with_id(&c, member, &refused_id, "two").await;
    assert_eq!(
        (next.status, &next.body["seq"]),
        (201, &json!(6)),
        "{next:?}"
    );
    let h = t.get(&format!("/conversations/{c}/messages"), owner).await;
    assert_eq!(seqs(&h.body), (1..=6).collect::<Vec<_>>());
    // Off again: no wait.
    assert_eq!(set_slow_mode(&t, &c, owner, 0).await.status, 200);
    assert_eq!(t.send(&c, member, "free").await.status, 201);
}

/// Slow mode counts a message sent just before it was switched on (found by probing: the
/// member's next send, 0.1 s later, was stored; docs/api.md §25 says a member who sent less than
/// the period ago waits).
#[tokio::test]
async fn slow_mode_counts_a_message_sent_before_it_was_switched_on() {
    let t = TestApp::new().await;
    let u = unique_users(2);
    let (owner, member) = (&u[0], &u[1]);
    let c = t.group(owner, &[member]).await;
    assert_eq!(t.send(&c, member, "before").await.status, 201);
    assert_eq!(set_slow_mode(&t, &c, owner, 30).await.status, 200);
    let refused = t.send(&c, member, "right after").await;
    assert_status(&refused, 429, "slow_mode");
    let after: u64 = refused.headers["retry-after"].parse().unwrap();
    assert!((25..=30).contains(&after), "{refused:?}");
    assert_eq!(t.send(&c, owner, "exempt").await.status, 201);
}

/// A send that answered `503` (outcome unknown) keeps its slot, and its retry (the same
/// `clientMsgId`) takes it again and learns the outcome, within the period (found by probing:
/// the retry was `429 slow_mode` for the rest of the period); another send still waits.
#[tokio::test]
async fn a_retry_after_a_503_learns_its_outcome_in_slow_mode() {
    let t = TestApp::new().await;
    let u = unique_users(2);
    let (owner, member) = (&u[0], &u[1]);
    let c = t.group(owner, &[member]).await;
    assert_eq!(set_slow_mode(&t, &c, owner, 60).await.status, 200);
    chat_tests::server::dynamodb_faults(&json!({"op": "TransactWriteItems", "table": t.table,
        "key": format!("C#{c}"), "kind": "InternalServerError", "count": 1000}));
    let id = new_uuid();
    let unknown = t.send_with_id(&c, member, &id, "one").await;
    chat_tests::server::clear_dynamodb_faults();
    assert_status(&unknown, 503, "unavailable");
    let retry = t.send_with_id(&c, member, &id, "one").await;
    assert_eq!(
        (retry.status, &retry.body["seq"]),
        (201, &json!(1)),
        "{retry:?}"
    );
    assert_eq!(t.send_with_id(&c, member, &id, "one").await.status, 200);
    assert_status(
        &t.send_with_id(&c, member, &new_uuid(), "two").await,
        429,
        "slow_mode",
    );
}

/// An admin who leaves the group, or is removed or banned, is an admin no more: added back, a
/// plain member (and the other admins stay).
#[tokio::test]
async fn an_admin_who_leaves_is_an_admin_no_more() {
    let t = TestApp::new().await;
    let u = unique_users(4);
    let (owner, a1, a2, m) = (&u[0], &u[1], &u[2], &u[3]);
    let c = t.group(owner, &[a1, a2, m]).await;
    for a in [a1, a2] {
        assert_eq!(admin(&t, &c, owner, a, true).await.status, 200);
    }
    assert_eq!(t.remove_member(&c, a1, a1).await.status, 204, "a1 leaves");
    let left = t.get(&format!("/conversations/{c}"), owner).await;
    assert_eq!(left.body["admins"], json!([a2]), "{left:?}");
    let banned = t
        .call(
            "POST",
            &format!("/conversations/{c}/bans/{a2}"),
            Some(owner),
            None,
        )
        .await;
    assert_eq!(banned.status, 204, "{banned:?}");
    let none = t.get(&format!("/conversations/{c}"), owner).await;
    assert!(none.body.get("admins").is_none(), "{none:?}");
    assert_eq!(t.add_members(&c, owner, json!([a1])).await.status, 200);
    let back = t.get(&format!("/conversations/{c}"), owner).await;
    assert!(
        back.body.get("admins").is_none(),
        "re-added, not an admin: {back:?}"
    );
    // Not an admin: may not set slow mode.
    assert_status(&set_slow_mode(&t, &c, a1, 10).await, 403, "forbidden");
}

/// Admins named at once are all named (found by probing: of 8 grants at once, 1 to 3 got `429`
/// after three lost races): each lost race is another grant landing, so a grant tries again
/// while its request's time lasts.
#[tokio::test]
async fn admins_named_at_once_are_all_named() {
    let t = std::sync::Arc::new(TestApp::new().await);
    let u = unique_users(9);
    let (owner, members) = (&u[0], &u[1..]);
    let c = t.group(owner, members).await;
    let grants = members.iter().map(|m| {
        let (t, c, owner, m) = (t.clone(), c.clone(), owner.clone(), m.clone());
        async move { admin(&t, &c, &owner, &m, true).await }
    });
    for r in chat_tests::at_once(grants).await {
        assert_eq!(r.status, 200, "{r:?}");
    }
    let conversation = t.get(&format!("/conversations/{c}"), owner).await;
    let mut admins: Vec<String> =
        serde_json::from_value(conversation.body["admins"].clone()).unwrap();
    admins.sort();
    let mut expected = members.to_vec();
    expected.sort();
    assert_eq!(admins, expected);
}

/// A grant racing the target's leave or ban never leaves a non-member an admin (found by
/// probing: in half the races the banned user stayed on the list, and was an admin again when
/// added back): the grant is conditioned on the membership it read.
#[tokio::test]
async fn a_grant_racing_a_leave_or_a_ban_leaves_no_outsider_an_admin() {
    let t = std::sync::Arc::new(TestApp::new().await);
    for trial in 0..8 {
        let u = unique_users(3);
        let (owner, x, z) = (u[0].clone(), u[1].clone(), u[2].clone());
        let c = t.group(&owner, &[&x, &z]).await;
        let ban = trial % 2 == 1;
        let grant = {
            let (t, c, owner, x) = (t.clone(), c.clone(), owner.clone(), x.clone());
            async move { admin(&t, &c, &owner, &x, true).await }
        };
        let gone = {
            let (t, c, owner, x) = (t.clone(), c.clone(), owner.clone(), x.clone());
            async move {
                if ban {
                    t.call(
                        "POST",
                        &format!("/conversations/{c}/bans/{x}"),
                        Some(&owner),
                        None,
                    )
                    .await
                } else {
                    t.call(
                        "DELETE",
                        &format!("/conversations/{c}/members/{x}"),
                        Some(&x),
                        None,
                    )
                    .await
                }
            }
        };
        let (granted, left) = tokio::join!(tokio::spawn(grant), tokio::spawn(gone));
        let (granted, left) = (granted.unwrap(), left.unwrap());
        assert_eq!(left.status, 204, "{left:?}");
        assert!([200, 404].contains(&granted.status), "{granted:?}");
        let conversation = t.get(&format!("/conversations/{c}"), &owner).await;
        assert!(
            conversation.body.get("admins").is_none(),
            "trial {trial} (ban: {ban}): {conversation:?}"
        );
    }
}
