//! Upgrading a stack that holds data of an older version (README, "Upgrading").

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use chat_store::retry::Deadline;
use chat_tests::{member_state, unique_users, TestApp};
use serde_json::json;

type Item = HashMap<String, AttributeValue>;

/// The member items of group `c`, wherever they are (the old layout's partition and the shards).
async fn member_items(t: &TestApp, c: &str) -> Vec<Item> {
    let mut items = t.partition(&format!("M#{c}")).await;
    for shard in 0..chat_store::keys::MEMBER_SHARDS {
        items.extend(t.partition(&format!("M#{c}#{shard}")).await);
    }
    items
}

/// Issue 28 item 6: a group whose members were written before the member shards (`pk =
/// M#<conversationId>`) is unreadable until migrated; `{"migrate": "memberShards"}` moves them,
/// keeps their watermarks, keeps a member's newer item where both exist, and a second run finds
/// nothing to move.
#[tokio::test]
async fn groups_written_before_the_member_shards_are_migrated_to_them() {
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
        let mut old = item.clone();
        old.insert("pk".into(), AttributeValue::S(format!("M#{c}")));
        t.put_items(&[old]).await;
        if item["sk"] != AttributeValue::S(format!("M#{}", users[3])) {
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
    }
    let before = t.get(&format!("/conversations/{c}"), owner).await;
    assert_eq!(
        before.status, 404,
        "unmigrated, this version cannot read it"
    );

    let migrate = || async {
        t.archiver()
            .migrate_member_shards(Deadline::after(Duration::from_secs(60)))
            .await
            .unwrap()
    };
    let first = migrate().await;
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

    let second = migrate().await;
    assert!(second.done, "{second:?}");
    assert_eq!(
        member_items(&t, &c).await.len(),
        4,
        "a second run changes nothing"
    );
}
