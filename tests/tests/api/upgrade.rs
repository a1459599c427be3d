//! Upgrading a stack that holds data of an older version (README, "Upgrading").

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use chat_store::retry::Deadline;
use chat_tests::{member_state, unique_users, TestApp};
use serde_json::json;

type Item = HashMap<String, AttributeValue>;

/// One test of this file at a time: a migration scans the whole (shared) table, and would move
/// another test's old-layout set-up while it is being looked at.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The member items of group `c`, wherever they are (the old layout's partition and the shards).
async fn member_items(t: &TestApp, c: &str) -> Vec<Item> {
    let mut items = t.partition(&format!("M#{c}")).await;
    for shard in 0..chat_store::keys::MEMBER_SHARDS {
        items.extend(t.partition(&format!("M#{c}#{shard}")).await);
    }
    items
}

async fn migrate(t: &TestApp) -> chat_store::migrate::MemberMigration {
    t.archiver()
        .migrate_member_shards(Deadline::after(Duration::from_secs(60)))
        .await
        .unwrap()
}

async fn unreadable(t: &TestApp, c: &str, member: &str) {
    let before = t.get(&format!("/conversations/{c}"), member).await;
    assert_eq!(
        before.status, 404,
        "unmigrated, this version cannot read it"
    );
}

/// Issue 28 item 6: a group whose members were written before the member shards (`pk =
/// M#<conversationId>`) is unreadable until migrated; `{"migrate": "memberShards"}` moves them,
/// keeps their watermarks, keeps a member's newer item where both exist, and a second run finds
/// nothing to move.
#[tokio::test]
async fn groups_written_before_the_member_shards_are_migrated_to_them() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let t = TestApp::new().await;
    let users = unique_users(4);
    let (owner, members) = (&users[0], &users[1..]);
    let c = t.group(owner, members).await;
    for i in 0..3 {
        t.send(&c, owner, &format!("m{i}")).await;
    }
    assert_eq!(t.mark_read(&c, &users[1], 2).await.status, 200);

    // The old layout: every member item in one partition, `M#<conversationId>`.
    let current = member_items(&t, &c).await;
    assert_eq!(current.len(), 4);
    for item in &current {
        // The last member is in both layouts (re-joined since): its newer item stays.
        let keep_new = item["sk"] == AttributeValue::S(format!("M#{}", users[3]));
        copy_item(&t, item, format!("M#{c}"), !keep_new).await;
    }
    unreadable(&t, &c, owner).await;

    let first = migrate(&t).await;
    assert!(first.done && first.moved >= 4, "{first:?}");
    let after = t.get(&format!("/conversations/{c}"), owner).await;
    assert_eq!(after.status, 200, "{after:?}");
    assert_eq!(after.body["memberCount"], 4);
    let reads = t.get(&format!("/conversations/{c}/reads"), owner).await;
    assert_eq!(
        member_state(&reads.body, &users[1])["lastReadSeq"],
        json!(2)
    );
    assert_eq!(member_state(&reads.body, owner)["lastReadSeq"], json!(3));
    assert!(
        t.partition(&format!("M#{c}")).await.is_empty(),
        "old items left"
    );
    assert_eq!(member_items(&t, &c).await.len(), 4);
    assert_eq!(t.send(&c, &users[2], "after").await.status, 201);

    let second = migrate(&t).await;
    assert!(second.done, "{second:?}");
    assert_eq!(
        member_items(&t, &c).await.len(),
        4,
        "a second run changes nothing"
    );
}

/// Copies `item` to partition `pk`, and deletes it where it was when `moved`: the set-up of an
/// old layout.
async fn copy_item(t: &TestApp, item: &Item, pk: String, moved: bool) {
    let mut old = item.clone();
    old.insert("pk".into(), AttributeValue::S(pk));
    t.put_items(&[old]).await;
    if !moved {
        return;
    }
    t.db.delete_item()
        .table_name(&t.table)
        .set_key(Some(HashMap::from([
            ("pk".to_owned(), item["pk"].clone()),
            ("sk".to_owned(), item["sk"].clone()),
        ])))
        .send()
        .await
        .unwrap();
}

/// A direct conversation's members and change head written before they joined its log
/// partition (`pk = M#<id>`, `pk = H#<id>, sk = H`): unreadable until migrated, and a change
/// made meanwhile never numbers a change again; `{"migrate": "layout"}` moves them, keeping the
/// watermarks and the change log, and a second run finds nothing to move.
#[tokio::test]
async fn direct_conversations_written_before_their_log_partition_held_members_are_migrated() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let t = TestApp::new().await;
    let (a, b, c) = t.new_direct().await;
    for i in 0..3 {
        assert_eq!(t.send(&c, &a, &format!("m{i}")).await.status, 201);
    }
    assert_eq!(t.mark_read(&c, &b, 2).await.status, 200);
    assert_eq!(t.react(&c, 1, &b, "ok", true).await.status, 200);
    assert_eq!(t.react(&c, 2, &b, "ok", true).await.status, 200);

    // The old layout.
    let log = t.partition(&format!("C#{c}")).await;
    let sk = |i: &Item| i["sk"].as_s().unwrap().clone();
    let moving: Vec<&Item> = log
        .iter()
        .filter(|i| sk(i).starts_with("M#") || sk(i) == "H")
        .collect();
    assert_eq!(moving.len(), 3, "two members and the change head: {log:?}");
    for item in moving {
        let pk = if sk(item) == "H" { "H" } else { "M" };
        copy_item(&t, item, format!("{pk}#{c}"), true).await;
    }
    unreadable(&t, &c, &a).await;

    let first = migrate(&t).await;
    assert!(first.done && first.moved >= 3, "{first:?}");
    assert!(
        t.partition(&format!("M#{c}")).await.is_empty(),
        "members left"
    );
    let heads = t.partition(&format!("H#{c}")).await;
    assert!(heads.iter().all(|i| sk(i) != "H"), "head left: {heads:?}");
    assert_eq!(
        heads.len(),
        2,
        "the change records stay in the change log: {heads:?}"
    );

    let after = t.get(&format!("/conversations/{c}"), &a).await;
    assert_eq!((after.status, &after.body["lastChange"]), (200, &json!(2)));
    let reads = t.get(&format!("/conversations/{c}/reads"), &a).await;
    assert_eq!(member_state(&reads.body, &b)["lastReadSeq"], json!(2));
    assert_eq!(member_state(&reads.body, &a)["lastReadSeq"], json!(3));
    let inbox = t.get("/inbox", &b).await;
    let entry = &inbox.body["conversations"][0];
    assert_eq!(
        (
            &entry["conversationId"],
            &entry["unreadCount"],
            &entry["lastChange"]
        ),
        (&json!(c), &json!(1), &json!(2)),
        "{inbox:?}"
    );
    // The change log goes on where it was.
    assert_eq!(t.react(&c, 3, &b, "ok", true).await.status, 200);
    let changes = t
        .get(&format!("/conversations/{c}/changes?afterChange=0"), &a)
        .await;
    let seqs: Vec<_> = changes.body["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ch| {
            (
                ch["changeSeq"].as_u64().unwrap(),
                ch["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(seqs, [(1, 1), (2, 2), (3, 3)]);

    let second = migrate(&t).await;
    assert!(second.done && second.moved == 0, "{second:?}");
}

/// Between the deployment and the layout migration, a change to a direct conversation whose head
/// is still where the old version wrote it cannot number itself 1 again: its record's put is
/// conditional, so the change fails and the log keeps its first record.
#[tokio::test]
async fn a_change_before_the_layout_migration_never_overwrites_a_record() {
    let _alone = ONE_AT_A_TIME.lock().await;
    // A short request budget: the change retries until it runs out.
    let t = TestApp::custom(Duration::from_secs(2), None).await;
    let (a, b, c) = t.new_direct().await;
    assert_eq!(t.send(&c, &a, "one").await.status, 201);
    assert_eq!(t.react(&c, 1, &b, "ok", true).await.status, 200);
    let log = t.partition(&format!("C#{c}")).await;
    let head = log
        .iter()
        .find(|i| i["sk"].as_s().unwrap() == "H")
        .expect("the head");
    copy_item(&t, head, format!("H#{c}"), true).await;
    let first: Vec<Item> = t.partition(&format!("H#{c}")).await;

    let r = t.react(&c, 1, &a, "no", true).await;
    assert!(r.status >= 400, "{r:?}");
    assert_eq!(
        t.partition(&format!("H#{c}")).await,
        first,
        "nothing written"
    );
}
