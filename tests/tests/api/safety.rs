//! Safety (docs/api.md §27–§30): blocks, bans, reports, moderators and suspensions, with the
//! races the issue names (a block during a send, a ban during an add) made likely by the
//! strictness layer's `slow` and `late` faults.

use chat_tests::{at_once, new_uuid, server, token_with, unique, TestApp};
use serde_json::{json, Value};
use std::sync::Arc;

async fn block(t: &TestApp, by: &str, user: &str, on: bool) -> chat_tests::Resp {
    let method = if on { "PUT" } else { "DELETE" };
    t.call(method, &format!("/me/blocks/{user}"), Some(by), None)
        .await
}

async fn ban(t: &TestApp, c: &str, by: &str, user: &str, on: bool) -> chat_tests::Resp {
    let method = if on { "POST" } else { "DELETE" };
    t.call(
        method,
        &format!("/conversations/{c}/bans/{user}"),
        Some(by),
        None,
    )
    .await
}

fn moderator(user: &str) -> String {
    token_with(user, json!({"scope": "openid chat:moderator"}))
}

/// The report of conversation `c` as a moderator's `moderationReports` lists it (paging through
/// the reports other tests made too).
pub(crate) async fn listed_report(t: &TestApp, c: &str) -> Value {
    let mut cursor = String::new();
    for _ in 0..1000 {
        let r = t
            .call_with_token(
                "GET",
                &format!("/moderation/reports?limit=100{cursor}"),
                moderator(&unique("mod")),
                None,
            )
            .await;
        assert_eq!(r.status, 200, "{r:?}");
        let reports = r.body["reports"].as_array().unwrap();
        if let Some(found) = reports.iter().find(|x| x["conversationId"] == json!(c)) {
            return found.clone();
        }
        match r.body["nextCursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    panic!("no report of {c} is listed")
}

#[tokio::test]
async fn a_blocked_user_cannot_open_send_in_or_add_the_blocker() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    assert_eq!(t.send(&c, &b, "before").await.status, 201);
    assert_eq!(block(&t, &a, &b, true).await.status, 204);
    assert_eq!(block(&t, &a, &b, true).await.status, 204, "idempotent");
    let r = t.send(&c, &b, "after").await;
    assert_eq!((r.status, r.code()), (403, "blocked"), "{r:?}");
    // Nor upload a file for it (a member, so not 404).
    let file = json!({"fileName": "a.png", "contentType": "image/png", "size": 10});
    let r = t
        .post(&format!("/conversations/{c}/attachments"), &b, file)
        .await;
    assert_eq!((r.status, r.code()), (403, "blocked"), "{r:?}");
    let r = t.open_direct(&b, &a).await;
    assert_eq!((r.status, r.code()), (403, "blocked"), "{r:?}");
    // The blocker still sends, and opens the conversation.
    assert_eq!(t.send(&c, &a, "mine").await.status, 201);
    assert_eq!(t.open_direct(&a, &b).await.status, 200);
    // B cannot add A to a group, nor create one with A.
    let (g_owner, g) = {
        let r = t
            .post(
                "/conversations",
                &b,
                json!({"type": "group", "title": "T", "memberIds": [a]}),
            )
            .await;
        assert_eq!((r.status, r.code()), (403, "blocked"), "{r:?}");
        let g = t.group(&b, &[unique("x")]).await;
        (b.clone(), g)
    };
    let r = t.add_members(&g, &g_owner, json!([a])).await;
    assert_eq!((r.status, r.code()), (403, "blocked"), "{r:?}");
    // A may add B (A is not blocked), and groups are otherwise unchanged.
    let list = t.get("/me/blocks", &a).await;
    assert_eq!(list.status, 200, "{list:?}");
    assert_eq!(list.body["blocks"][0]["userId"], json!(b));
    assert_eq!(block(&t, &a, &b, false).await.status, 204);
    assert_eq!(t.send(&c, &b, "again").await.status, 201);
    assert_eq!(t.get("/me/blocks", &a).await.body["blocks"], json!([]));
}

/// A blocked user may not edit its messages in the direct conversation or add reactions there
/// (found by probing: it could rewrite what the blocker reads); it may still delete its own and
/// take its reactions back. A retry of what it did before the block (a send, an edit) learns
/// its outcome, as every retry does (found by probing: a replayed send was `403`).
#[tokio::test]
async fn a_blocked_user_edits_and_reacts_no_more_but_its_retries_learn_their_outcome() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let (sent, edited) = (new_uuid(), new_uuid());
    assert_eq!(t.send_with_id(&c, &b, &sent, "before").await.status, 201);
    assert_eq!(t.edit(&c, 1, &b, &edited, "edited").await.status, 200);
    assert_eq!(t.react(&c, 1, &b, "ok", true).await.status, 200);
    assert_eq!(block(&t, &a, &b, true).await.status, 204);

    let replay = t.send_with_id(&c, &b, &sent, "before").await;
    assert_eq!(
        (replay.status, &replay.body["seq"]),
        (200, &json!(1)),
        "{replay:?}"
    );
    for refused in [
        t.send_with_id(&c, &b, &sent, "another body").await,
        t.send(&c, &b, "after").await,
        t.edit(&c, 1, &b, &new_uuid(), "rewritten").await,
        t.react(&c, 1, &b, "no", true).await,
    ] {
        assert_eq!(
            (refused.status, refused.code()),
            (403, "blocked"),
            "{refused:?}"
        );
    }
    let again = t.edit(&c, 1, &b, &edited, "edited").await;
    assert_eq!(
        (again.status, &again.body["body"]),
        (200, &json!("edited")),
        "{again:?}"
    );
    let history = t.get(&format!("/conversations/{c}/messages"), &a).await;
    assert_eq!(
        history.body["messages"][0]["body"],
        json!("edited"),
        "{history:?}"
    );
    assert_eq!(history.body["lastSeq"], json!(1), "{history:?}");
    // Taking back and deleting its own are not refused.
    assert_eq!(t.react(&c, 1, &b, "ok", false).await.status, 200);
    let deleted = t.delete_message(&c, 1, &b, &new_uuid()).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    // The blocker is not affected.
    assert_eq!(t.send(&c, &a, "mine").await.status, 201);
    assert_eq!(t.react(&c, 2, &a, "ok", true).await.status, 200);
}

/// `blocks` pages: a page that ends the list has no cursor, even when it is full (found by
/// probing: `limit=1` with one block answered a cursor to an empty page).
#[tokio::test]
async fn the_last_page_of_blocks_has_no_cursor() {
    let t = TestApp::new().await;
    let (a, b, c) = (unique("a"), unique("b"), unique("c"));
    assert_eq!(block(&t, &a, &b, true).await.status, 204);
    let only = t.get("/me/blocks?limit=1", &a).await;
    assert_eq!(only.body["blocks"].as_array().unwrap().len(), 1, "{only:?}");
    assert_eq!(only.body["nextCursor"], json!(null), "{only:?}");
    assert_eq!(block(&t, &a, &c, true).await.status, 204);
    let first = t.get("/me/blocks?limit=1", &a).await;
    let cursor = first.body["nextCursor"].as_str().expect("a second page");
    let second = t
        .get(&format!("/me/blocks?limit=1&cursor={cursor}"), &a)
        .await;
    assert_eq!(
        second.body["blocks"].as_array().unwrap().len(),
        1,
        "{second:?}"
    );
    assert_eq!(second.body["nextCursor"], json!(null), "{second:?}");
    let mut seen = vec![
        first.body["blocks"][0]["userId"].clone(),
        second.body["blocks"][0]["userId"].clone(),
    ];
    seen.sort_by_key(|v| v.to_string());
    let mut want = vec![json!(b), json!(c)];
    want.sort_by_key(|v| v.to_string());
    assert_eq!(seen, want);
}

#[tokio::test]
async fn blocking_before_the_conversation_exists_holds_once_it_is_created() {
    let t = TestApp::new().await;
    let (a, b) = (unique("a"), unique("b"));
    assert_eq!(block(&t, &a, &b, true).await.status, 204);
    let r = t.open_direct(&b, &a).await;
    assert_eq!((r.status, r.code()), (403, "blocked"), "{r:?}");
    // A opens it: B's member item is created blocked.
    let c = t.direct(&a, &b).await;
    let r = t.send(&c, &b, "hi").await;
    assert_eq!((r.status, r.code()), (403, "blocked"), "{r:?}");
    assert_eq!(t.send(&c, &a, "hi").await.status, 201);
}

#[tokio::test]
async fn bad_blocks_are_400_and_non_members_404() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    let r = block(&t, &a, &a, true).await;
    assert_eq!((r.status, r.code()), (400, "invalid_request"), "{r:?}");
    let r = t.call("PUT", "/me/blocks/bad%20id", Some(&a), None).await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = t.get("/me/blocks?limit=0", &a).await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = t.get("/me/blocks?cursor=Tm9wZQ", &a).await;
    assert_eq!(r.status, 400, "a cursor of another list: {r:?}");
    let stranger = unique("s");
    let r = t
        .post(
            &format!("/conversations/{c}/messages/1/reports"),
            &stranger,
            json!({"reason": "spam"}),
        )
        .await;
    assert_eq!(r.status, 404, "{r:?}");
    let _ = b;
}

/// A block during a send: the send's transaction conditions on the member item the block
/// marks, so either the send committed first (and is kept) or it is refused; never a message
/// stored after the block answered. `slow`: the send's transaction holds its items, the block
/// waits for it (send 201, then the block). `late`: the send's transaction reaches DynamoDB after
/// the block committed, and its condition refuses it (403).
#[tokio::test]
async fn a_block_during_a_send_either_follows_the_send_or_refuses_it() {
    if server::dynamodb_partitions().is_none() {
        eprintln!("skipped: needs the strictness layer");
        return;
    }
    let t = Arc::new(TestApp::new().await);
    let (a, b, c) = t.new_direct().await;
    for kind in ["slow", "late"] {
        // The send's transaction held (slow) or late on the wire (late) while the block runs.
        server::dynamodb_faults(&json!({"op": "TransactWriteItems", "table": "ChatTable",
            "key": format!("C#{c}"), "kind": kind, "delayMs": 1000, "count": 1}));
        let (t1, t2) = (t.clone(), t.clone());
        let (c1, b1, a2, b2) = (c.clone(), b.clone(), a.clone(), b.clone());
        let send = tokio::spawn(async move { t1.send(&c1, &b1, kind).await });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let blocked = tokio::spawn(async move { block(&t2, &a2, &b2, true).await });
        let (send, blocked) = (send.await.unwrap(), blocked.await.unwrap());
        assert_eq!(blocked.status, 204, "{blocked:?}");
        let expected = if kind == "slow" {
            (201, "")
        } else {
            (403, "blocked")
        };
        assert_eq!((send.status, send.code()), expected, "{kind}: {send:?}");
        // After the block answered: refused, whatever the send did.
        let r = t.send(&c, &b, "after").await;
        assert_eq!((r.status, r.code()), (403, "blocked"), "{r:?}");
        let page = t
            .get(&format!("/conversations/{c}/messages?limit=100"), &a)
            .await;
        let bodies: Vec<&str> = page.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["body"].as_str())
            .collect();
        assert_eq!(bodies.contains(&kind), send.status == 201, "{bodies:?}");
        assert!(!bodies.contains(&"after"));
        assert_eq!(block(&t, &a, &b, false).await.status, 204);
    }
}

#[tokio::test]
async fn a_ban_removes_the_member_and_keeps_them_out_until_lifted() {
    let t = TestApp::new().await;
    let (o, m) = (unique("o"), unique("m"));
    let admin = unique("adm");
    let g = t.group(&o, &[&m, &admin]).await;
    // A member may not ban; nobody bans the owner or themselves.
    let r = ban(&t, &g, &m, &admin, true).await;
    assert_eq!((r.status, r.code()), (403, "forbidden"), "{r:?}");
    assert_eq!(ban(&t, &g, &o, &o, true).await.status, 400);
    assert_eq!(
        ban(&t, &g, &unique("s"), &m, true).await.status,
        404,
        "non-member"
    );
    assert_eq!(ban(&t, &g, &o, &m, true).await.status, 204);
    assert_eq!(t.send(&g, &m, "hi").await.status, 404, "no longer a member");
    let r = t.add_members(&g, &o, json!([m])).await;
    assert_eq!((r.status, r.code()), (403, "forbidden"), "{r:?}");
    // A ban of a non-member keeps them out too.
    let never = unique("n");
    assert_eq!(ban(&t, &g, &o, &never, true).await.status, 204);
    assert_eq!(t.add_members(&g, &admin, json!([never])).await.status, 403);
    assert_eq!(ban(&t, &g, &o, &m, false).await.status, 204);
    assert_eq!(t.add_members(&g, &o, json!([m])).await.status, 200);
    // Direct conversations have no bans.
    let (a, b, c) = t.new_direct().await;
    assert_eq!(ban(&t, &c, &a, &b, true).await.status, 409);
}

/// A ban during an add: the add conditions on the conversation's `banVersion`, read before the
/// bans, so the banned user never ends a member. `slow`: the add's transaction holds the
/// conversation item, the ban waits and then removes the new member. `late`: the add's
/// transaction arrives after the ban committed, its condition refuses it, and the add read again
/// is refused (403).
#[tokio::test]
async fn a_ban_during_an_add_never_leaves_the_banned_user_a_member() {
    if server::dynamodb_partitions().is_none() {
        eprintln!("skipped: needs the strictness layer");
        return;
    }
    let t = Arc::new(TestApp::new().await);
    let o = unique("o");
    let g = t.group(&o, &[unique("m")]).await;
    for kind in ["slow", "late"] {
        let target = unique("t");
        server::dynamodb_faults(&json!({"op": "TransactWriteItems", "table": "ChatTable",
            "key": format!("C#{g}"), "kind": kind, "delayMs": 1000, "count": 1}));
        let (t1, t2) = (t.clone(), t.clone());
        let (g1, o1, x1, g2, o2, x2) = (
            g.clone(),
            o.clone(),
            target.clone(),
            g.clone(),
            o.clone(),
            target.clone(),
        );
        let added = tokio::spawn(async move { t1.add_members(&g1, &o1, json!([x1])).await });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let banned = tokio::spawn(async move { ban(&t2, &g2, &o2, &x2, true).await });
        let (added, banned) = (added.await.unwrap(), banned.await.unwrap());
        assert_eq!(banned.status, 204, "{banned:?}");
        let expected = if kind == "slow" { 200 } else { 403 };
        assert_eq!(added.status, expected, "{kind}: {added:?}");
        let now = t.get(&format!("/conversations/{g}"), &o).await;
        let members = now.body["memberIds"].as_array().unwrap();
        assert!(!members.contains(&json!(target)), "{kind}: {now:?}");
    }
}

#[tokio::test]
async fn a_report_keeps_its_snapshot_after_the_message_is_deleted() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    assert_eq!(t.send(&c, &a, "offensive").await.status, 201);
    let path = format!("/conversations/{c}/messages/1/reports");
    for (body, status) in [
        (json!({"reason": "rude"}), 400),
        (json!({"reason": "spam", "note": "n".repeat(1001)}), 400),
        (json!({}), 400),
    ] {
        assert_eq!(t.post(&path, &b, body).await.status, status);
    }
    let missing = format!("/conversations/{c}/messages/9/reports");
    assert_eq!(
        t.post(&missing, &b, json!({"reason": "spam"})).await.status,
        404
    );
    let r = t
        .post(&path, &b, json!({"reason": "abuse", "note": "please look"}))
        .await;
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(t.delete_message(&c, 1, &a, &new_uuid()).await.status, 200);
    // Not a moderator: 403. A moderator sees it, snapshot intact.
    let r = t.get("/moderation/reports", &b).await;
    assert_eq!((r.status, r.code()), (403, "forbidden"), "{r:?}");
    let report = listed_report(&t, &c).await;
    assert_eq!(report["message"]["body"], "offensive");
    assert_eq!(report["reason"], "abuse");
    assert_eq!(report["reporterId"], json!(b));
    assert!(report.get("ttl").is_none());
    // The deletion guarantee holds for the conversation itself.
    let page = t.get(&format!("/conversations/{c}/messages"), &a).await;
    assert_eq!(page.body["messages"][0]["body"], "");
}

#[tokio::test]
async fn moderators_delete_any_message_and_suspend_users() {
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    assert_eq!(t.send(&c, &a, "spam").await.status, 201);
    let m = unique("mod");
    let path = format!(
        "/conversations/{c}/messages/1?clientChangeId={}",
        new_uuid()
    );
    // Not a moderator and not a member: 404.
    assert_eq!(t.call("DELETE", &path, Some(&m), None).await.status, 404);
    let groups = token_with(&m, json!({"cognito:groups": ["moderators"]}));
    let r = t.call_with_token("DELETE", &path, groups, None).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["deleted"], true);
    // Suspension: every request of the user 403 until lifted; only moderators suspend.
    let r = t
        .call(
            "PUT",
            &format!("/moderation/suspensions/{a}"),
            Some(&b),
            None,
        )
        .await;
    assert_eq!(r.status, 403, "{r:?}");
    // Nor themselves: they could not lift it.
    let own = format!("/moderation/suspensions/{m}");
    let r = t.call_with_token("PUT", &own, moderator(&m), None).await;
    assert_eq!((r.status, r.code()), (400, "invalid_request"), "{r:?}");
    let put = format!("/moderation/suspensions/{a}");
    assert_eq!(
        t.call_with_token("PUT", &put, moderator(&m), None)
            .await
            .status,
        204
    );
    for r in [
        t.send(&c, &a, "x").await,
        t.get("/inbox", &a).await,
        t.get(&format!("/conversations/{c}"), &a).await,
    ] {
        assert_eq!((r.status, r.code()), (403, "suspended"), "{r:?}");
    }
    assert_eq!(t.send(&c, &b, "others are fine").await.status, 201);
    assert_eq!(
        t.call_with_token("DELETE", &put, moderator(&m), None)
            .await
            .status,
        204
    );
    assert_eq!(t.send(&c, &a, "back").await.status, 201);
}

#[tokio::test]
async fn every_rule_runs_at_once_without_5xx() {
    let t = Arc::new(TestApp::new().await);
    let (a, b, c) = t.new_direct().await;
    let requests = (0..10).map(|i| {
        let (t, a, b, c) = (t.clone(), a.clone(), b.clone(), c.clone());
        async move {
            if i % 2 == 0 {
                block(&t, &a, &b, i % 4 == 0).await.status
            } else {
                t.send(&c, &b, "x").await.status
            }
        }
    });
    for status in at_once(requests).await {
        assert!(status < 500, "{status}");
    }
}
