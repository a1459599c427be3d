//! Item keys (docs/data-model.md §1). A conversation's log, `pk = C#<conversationId>`, is the
//! partition its sends write. A group's members live apart, so read receipts never take a hot
//! group's write throughput: spread over `MEMBER_SHARDS` partitions `pk = M#<conversationId>#<shard>`
//! by a hash of the user id, so that receipts and the sends' own watermarks share 4,000 write
//! units a second, not 1,000. A direct conversation's two members and its change head live in its
//! log partition instead, beside the conversation item (`C` < `H` < `M#…`): two people write far
//! below one partition's limit, and an inbox page reads all three in one Query of about 1 KB (one
//! read unit instead of three; `DIRECT_HEAD_RANGE`). The sort key says what an item is:
//!
//! | pk | sk | item |
//! |---|---|---|
//! | `C#` | `C` | the conversation (lastSeq, memberCount, last message, membership change) |
//! | `C#` (direct) | `H` | a direct conversation's change head (as `H#`'s below) |
//! | `C#` (direct) | `M#<userId>` | a direct conversation's member and its read watermark |
//! | `C#` | `S#<seq, 20 digits>` | a message |
//! | `C#` | `P!` | the last group commit: which sends it committed, at which seqs |
//! | `C#` | `P#<clientMsgId>` | a send waiting for a group commit (only while a conversation is contended) |
//! | `C#` | `X#<clientMsgId>` | the idempotency key of a send, until its message is archived |
//! | `M#…#<shard>` | `M#<userId>` | a group's member and its read watermark (`lastReadSeq`) |
//! | `H#` | `H` | a group's change head: the newest `changeSeq` and that change (docs/data-model.md §8) |
//! | `H#` | `H#<changeSeq, 20 digits>` | a change record (no message content) |
//! | `H#` | `K#<clientChangeId>` | the idempotency key of an edit or a deletion, kept forever |
//! | `RX#` | `C#<seq, 20 digits>` | a message's reaction counts, or the mark that it was deleted |
//! | `RX#` | `U#<seq, 20 digits>#<userId>` | one member's reactions to one message |
//!
//! Changes live off `C#`, so that edits and reactions take none of a hot conversation's write
//! throughput and never conflict with its sends.
//!
//! Sort keys stay distinct across the two partitions, so a BatchGetItem of both tells its items
//! apart by `sk` alone.
//!
//! Each user's inbox index is the item collection `pk = I#<userId>`: one entry per membership,
//! `sk = A#<activityKey>#<conversationId>`, so a descending Query walks the user's conversations
//! newest first. Nothing else is stored under `I#`.
//!
//! Safety (docs/data-model.md §10): `pk = B#<blocker>, sk = B#<blocked>` (a block),
//! `pk = BN#<conversationId>, sk = U#<userId>` (a ban), `pk = RP#open, sk = O#<createdAt>#<id>`
//! (an open report, oldest first) and `pk = SU#<userId>, sk = SU` (a suspension).
//!
//! Archived keys table: `k = <hash of conversation and clientMsgId>`, the idempotency key of an
//! archived message, kept forever (docs/data-model.md §2.4c).
//!
//! Connections table (`connections`): `pk = U#<userId>, sk = P` (a user's live connections) and
//! `pk = W#<connectionId>, sk = U` (who owns a connection, for `$disconnect`).

use aws_sdk_dynamodb::types::AttributeValue;

use super::attrs::Item;
use chat_domain::inbox::InboxPosition;
use chat_domain::{ConversationId, UserId};

pub const PK: &str = "pk";
pub const SK: &str = "sk";
pub const CONVERSATION_SK: &str = "C";
pub const MEMBER_SK_PREFIX: &str = "M#";
pub const FIRST_MESSAGE_SK: &str = "S#00000000000000000000";
pub const LAST_MESSAGE_SK: &str = "S#99999999999999999999";

pub fn key(pk: String, sk: impl Into<String>) -> Item {
    Item::from([
        (PK.to_owned(), AttributeValue::S(pk)),
        (SK.to_owned(), AttributeValue::S(sk.into())),
    ])
}

pub fn conversation_pk(id: &ConversationId) -> String {
    format!("C#{id}")
}

pub fn conversation_id_of_pk(pk: &str) -> Option<ConversationId> {
    pk.strip_prefix("C#").and_then(ConversationId::parse)
}

pub fn conversation_key(id: &ConversationId) -> Item {
    key(conversation_pk(id), CONVERSATION_SK)
}

pub fn member_sk(user: &UserId) -> String {
    format!("{MEMBER_SK_PREFIX}{user}")
}

/// The member partitions of a group: a hot group's receipts (one write unit each) and its
/// senders' watermarks (two each, inside the group commit) fill one partition's 1,000 write units
/// a second at about 80 sends a second with 10 receipts per send (docs/benchmarks.md).
pub const MEMBER_SHARDS: u64 = 4;

/// The end of the member sort keys: `M#<userId>` < `M$` for every user id.
pub const MEMBERS_END_SK: &str = "M$";

/// How many partitions hold a conversation's members: a direct conversation's two members write
/// far below one partition's limit, and reading them stays one Query.
pub fn member_shards(id: &ConversationId) -> u64 {
    if id.is_direct() {
        1
    } else {
        MEMBER_SHARDS
    }
}

/// Every partition of a conversation's member items (read all at once: one round trip; a
/// reader names the sort keys `M#` to `MEMBERS_END_SK`, since a direct conversation's members
/// share its log partition).
pub fn members_pks(id: &ConversationId) -> Vec<String> {
    match member_shards(id) {
        1 => vec![conversation_pk(id)],
        n => (0..n).map(|shard| format!("M#{id}#{shard}")).collect(),
    }
}

/// The partition of one member's item.
pub fn members_pk(id: &ConversationId, user: &UserId) -> String {
    match member_shards(id) {
        1 => conversation_pk(id),
        n => format!("M#{id}#{}", fnv1a(user.as_str()) % n),
    }
}

/// FNV-1a, 64 bits: stable across builds and platforms (the shard is part of a stored key), and
/// even enough over user ids.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

pub fn member_key(id: &ConversationId, user: &UserId) -> Item {
    key(members_pk(id, user), member_sk(user))
}

pub fn message_sk(seq: u64) -> String {
    format!("S#{seq:020}")
}

/// The change log of a conversation: its head, records and idempotency keys.
pub fn changes_pk(id: &ConversationId) -> String {
    format!("H#{id}")
}

pub const CHANGE_HEAD_SK: &str = "H";
pub const LAST_CHANGE_SK: &str = "H#99999999999999999999";

/// The partition of a conversation's change head: a group's change log (`H#`), so that its edits
/// and reactions take none of a hot group's write throughput and never touch its log; a direct
/// conversation's log partition, beside its conversation item and members, so that an inbox page
/// reads the three in one Query (`DIRECT_HEAD_RANGE`).
pub fn change_head_pk(id: &ConversationId) -> String {
    if id.is_direct() {
        conversation_pk(id)
    } else {
        changes_pk(id)
    }
}

pub fn change_head_key(id: &ConversationId) -> Item {
    key(change_head_pk(id), CHANGE_HEAD_SK)
}

/// The sort keys of a direct conversation's log partition that hold its conversation item, its
/// change head and its two members, and nothing else: one Query of them is the whole of what an
/// inbox entry shows.
pub const DIRECT_HEAD_RANGE: (&str, &str) = (CONVERSATION_SK, MEMBERS_END_SK);

pub fn change_sk(change_seq: u64) -> String {
    format!("H#{change_seq:020}")
}

pub fn change_key_sk(client_change_key: &str) -> String {
    format!("K#{client_change_key}")
}

pub fn change_key_key(id: &ConversationId, client_change_key: &str) -> Item {
    key(changes_pk(id), change_key_sk(client_change_key))
}

/// What lives beside a conversation's messages: their reaction counts and who reacted.
pub fn reactions_pk(id: &ConversationId) -> String {
    format!("RX#{id}")
}

pub fn reaction_counts_sk(seq: u64) -> String {
    format!("C#{seq:020}")
}

pub fn reaction_counts_key(id: &ConversationId, seq: u64) -> Item {
    key(reactions_pk(id), reaction_counts_sk(seq))
}

/// The sort-key prefix of one message's reactors (`U#<seq>#`), in user order.
pub fn reactors_prefix(seq: u64) -> String {
    format!("U#{seq:020}#")
}

pub fn reactor_sk(seq: u64, user: &UserId) -> String {
    format!("{}{user}", reactors_prefix(seq))
}

pub fn reactor_key(id: &ConversationId, seq: u64, user: &UserId) -> Item {
    key(reactions_pk(id), reactor_sk(seq, user))
}

pub fn message_key(id: &ConversationId, seq: u64) -> Item {
    key(conversation_pk(id), message_sk(seq))
}

pub fn send_key_sk(client_msg_key: &str) -> String {
    format!("X#{client_msg_key}")
}

/// The key item of the send `client_msg_key` (lower-case `clientMsgId`) in conversation `id`.
pub fn send_key(id: &ConversationId, client_msg_key: &str) -> Item {
    key(conversation_pk(id), send_key_sk(client_msg_key))
}

/// The archived keys table's only key attribute.
pub const ARCHIVED_KEY: &str = "k";

/// Where the idempotency key of a send lives once its message is archived: the archived keys
/// table, under the shortest name that identifies it (`archived_key_id`), since it stays forever
/// and DynamoDB bills its key's bytes like any other (docs/data-model.md §2.4c).
pub fn archived_send_key(id: &ConversationId, client_msg_key: &str) -> Item {
    let name = chat_domain::message::archived_key_id(id, client_msg_key);
    Item::from([(ARCHIVED_KEY.to_owned(), AttributeValue::S(name))])
}

pub fn inbox_pk(user: &UserId) -> String {
    format!("I#{user}")
}

pub const INBOX_ENTRY_PREFIX: &str = "A#";
/// After every moving entry (`A#…`), before the big-group entries (`G#…`).
pub const INBOX_ENTRIES_END: &str = "A$";

/// `A#<activityKey>#<conversationId>`: the activity key (RFC 3339) has no `#`.
pub fn inbox_sk(position: &InboxPosition) -> String {
    format!(
        "{INBOX_ENTRY_PREFIX}{}#{}",
        position.key, position.conversation_id
    )
}

pub fn inbox_position_of_sk(sk: &str) -> Option<InboxPosition> {
    let (key, id) = sk.strip_prefix(INBOX_ENTRY_PREFIX)?.rsplit_once('#')?;
    Some(InboxPosition {
        key: key.to_owned(),
        conversation_id: ConversationId::parse(id)?,
    })
}

pub fn inbox_entry_key(user: &UserId, position: &InboxPosition) -> Item {
    key(inbox_pk(user), inbox_sk(position))
}

/// A big-group entry's sort key: `G#<conversationId>`, beside the caller's moving entries.
pub const BIG_GROUP_PREFIX: &str = "G#";

pub fn big_group_sk(id: &ConversationId) -> String {
    format!("{BIG_GROUP_PREFIX}{id}")
}

pub fn big_group_key(user: &UserId, id: &ConversationId) -> Item {
    key(inbox_pk(user), big_group_sk(id))
}

/// Sorts just before the queued sends: one Query reads both.
pub const COMMIT_RECORD_SK: &str = "P!";
pub const QUEUED_PREFIX: &str = "P#";
pub const QUEUED_END_SK: &str = "P$";

pub fn queued_sk(client_msg_key: &str) -> String {
    format!("{QUEUED_PREFIX}{client_msg_key}")
}

/// A user's devices (docs/data-model.md, notifications).
pub fn devices_pk(user: &UserId) -> String {
    format!("DEV#{user}")
}

pub fn device_sk(device_id: &str) -> String {
    format!("D#{device_id}")
}

pub fn device_key(user: &UserId, device_id: &str) -> Item {
    key(devices_pk(user), device_sk(device_id))
}

/// Who holds a device token: keyed by a hash, since a token may be longer than a key may be.
pub fn token_owner_key(platform: &str, token: &str) -> Item {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{platform}\n{token}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    key(format!("TOK#{hex}"), "T")
}

/// A conversation's open notification window.
pub fn notify_window_key(id: &ConversationId) -> Item {
    key(format!("NW#{id}"), "N")
}

pub fn user_connections_pk(user: &UserId) -> String {
    format!("U#{user}")
}

pub fn connection_pk(connection_id: &str) -> String {
    format!("W#{connection_id}")
}

pub const PRESENCE_SK: &str = "P";
pub const CONNECTION_OWNER_SK: &str = "U";

pub const BLOCK_PREFIX: &str = "B#";

pub fn blocks_pk(blocker: &UserId) -> String {
    format!("B#{blocker}")
}

/// Whether `blocker` blocks `blocked`: one GetItem of this key.
pub fn block_key(blocker: &UserId, blocked: &UserId) -> Item {
    key(blocks_pk(blocker), format!("{BLOCK_PREFIX}{blocked}"))
}

pub fn bans_pk(id: &ConversationId) -> String {
    format!("BN#{id}")
}

pub fn ban_key(id: &ConversationId, user: &UserId) -> Item {
    key(bans_pk(id), format!("U#{user}"))
}

pub const REPORTS_PK: &str = "RP#open";
pub const REPORT_PREFIX: &str = "O#";

/// Open reports sort oldest first by this key.
pub fn report_sk(created_at: &str, report_id: &str) -> String {
    format!("{REPORT_PREFIX}{created_at}#{report_id}")
}

pub fn suspension_key(user: &UserId) -> Item {
    key(format!("SU#{user}"), "SU")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_keys_sort_by_seq() {
        assert!(message_sk(9) < message_sk(10));
        assert!(message_sk(u64::MAX).as_str() <= LAST_MESSAGE_SK);
        assert!(FIRST_MESSAGE_SK < message_sk(1).as_str());
    }

    #[test]
    fn each_kind_of_item_has_its_own_sort_key_range() {
        let lowest = UserId::parse("-").unwrap();
        // `|` sorts after every other character a user id may have.
        let highest = UserId::parse(&"|".repeat(128)).unwrap();
        let id = ConversationId::parse("d-0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(members_pk(&id, &lowest), conversation_pk(&id));
        assert_eq!(
            change_head_key(&id),
            key(conversation_pk(&id), CHANGE_HEAD_SK)
        );
        assert_eq!(conversation_id_of_pk(&conversation_pk(&id)), Some(id));
        // Member sort keys never collide with the log's, whichever partition a batch read names,
        // and a direct conversation's item, head and members are one range of nothing else.
        let (first, end) = DIRECT_HEAD_RANGE;
        assert_eq!(first, CONVERSATION_SK);
        assert!(CONVERSATION_SK < CHANGE_HEAD_SK);
        assert!(CHANGE_HEAD_SK < member_sk(&lowest).as_str());
        assert!(member_sk(&highest).as_str() < end);
        assert!(end < COMMIT_RECORD_SK);
        assert!(send_key_sk("0").as_str() > LAST_MESSAGE_SK);
        // Queued sends sort before messages: one Query reads just them.
        assert!(COMMIT_RECORD_SK < queued_sk("").as_str());
        assert!(queued_sk("ffffffff-ffff-ffff-ffff-ffffffffffff").as_str() < QUEUED_END_SK);
        assert!(QUEUED_END_SK < FIRST_MESSAGE_SK);
    }

    #[test]
    fn a_groups_members_spread_over_its_shards_and_a_direct_conversations_stay_together() {
        let direct = ConversationId::parse("d-0123456789abcdef0123456789abcdef").unwrap();
        let group = ConversationId::parse("g-0123456789abcdef0123456789abcdef").unwrap();
        let users: Vec<UserId> = (0..400)
            .map(|i| UserId::parse(&format!("user-{i}")).unwrap())
            .collect();
        assert_eq!(members_pks(&direct), [format!("C#{direct}")]);
        assert!(users
            .iter()
            .all(|u| members_pk(&direct, u) == format!("C#{direct}")));
        assert_eq!(change_head_pk(&group), format!("H#{group}"));
        let shards = members_pks(&group);
        assert_eq!(shards.len(), MEMBER_SHARDS as usize);
        let mut counts = vec![0; shards.len()];
        for u in &users {
            let pk = members_pk(&group, u);
            counts[shards
                .iter()
                .position(|s| *s == pk)
                .expect("one of the shards")] += 1;
        }
        // Each shard takes its part of the members (100 each on average).
        assert!(
            counts.iter().all(|&n| (60..=140).contains(&n)),
            "{counts:?}"
        );
        // The stored layout: the same user lands in the same shard in every build.
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn inbox_entries_sort_by_activity_then_id() {
        let at = |key: &str, id: &str| InboxPosition {
            key: key.into(),
            conversation_id: ConversationId::parse(id).unwrap(),
        };
        let d = "d-0123456789abcdef0123456789abcdef";
        let g = "g-0123456789abcdef0123456789abcdef";
        let older = at("2026-01-01T00:00:01.000Z", g);
        let newer = at("2026-01-01T00:00:02.000Z", d);
        let tie = at("2026-01-01T00:00:02.000Z", g);
        assert!(inbox_sk(&older) < inbox_sk(&newer));
        assert!(
            inbox_sk(&newer) < inbox_sk(&tie),
            "the same order as InboxPosition"
        );
        assert!(newer < tie);
        assert_eq!(inbox_position_of_sk(&inbox_sk(&tie)), Some(tie));
        assert_eq!(
            inbox_position_of_sk("A#2026-01-01T00:00:02.000Z#nope"),
            None
        );
        assert_eq!(inbox_position_of_sk("M#u"), None);
        let last = at("9999-12-31T23:59:59.999Z", g);
        assert!(inbox_sk(&last).as_str() < INBOX_ENTRIES_END);
        assert!(INBOX_ENTRIES_END < big_group_sk(&last.conversation_id).as_str());
        let user = UserId::parse("u").unwrap();
        assert_eq!(inbox_pk(&user), "I#u");
    }
}
