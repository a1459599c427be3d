//! Item keys of the chat table (docs/data-model.md). All items of a conversation share
//! `pk = C#<conversationId>`; the sort key says what the item is:
//!
//! | sk | item |
//! |---|---|
//! | `C` | the conversation (lastSeq, memberCount, last message, membership change) |
//! | `M#<userId>` | a member and its read watermark (`lastReadSeq`) |
//! | `S#<seq, 20 digits>` | a message |
//! | `X#<clientMsgId>` | the idempotency key of a send, kept forever |
//!
//! `C` sorts just before `M#…`, so one Query `sk BETWEEN "C" AND "M$"` reads a conversation and all
//! its members.

pub const PK: &str = "pk";
pub const SK: &str = "sk";
pub const CONVERSATION_SK: &str = "C";
pub const MEMBERS_END_SK: &str = "M$";
pub const MEMBER_INDEX: &str = "byMember";
pub const MEMBER_INDEX_KEY: &str = "memberId";

pub fn conversation_pk(conversation_id: &str) -> String {
    format!("C#{conversation_id}")
}

pub fn conversation_id_of_pk(pk: &str) -> Option<&str> {
    pk.strip_prefix("C#")
}

pub fn member_sk(user_id: &str) -> String {
    format!("M#{user_id}")
}

pub fn message_sk(seq: u64) -> String {
    format!("S#{seq:020}")
}

pub const FIRST_MESSAGE_SK: &str = "S#00000000000000000000";
pub const LAST_MESSAGE_SK: &str = "S#99999999999999999999";

pub fn client_msg_sk(client_msg_id: &str) -> String {
    format!("X#{client_msg_id}")
}

/// Connections table (see `connections`): `pk = U#<userId>, sk = P` (a user's live connections)
/// and `pk = W#<connectionId>, sk = U` (who owns a connection, for $disconnect).
pub fn user_connections_pk(user_id: &str) -> String {
    format!("U#{user_id}")
}

pub fn connection_pk(connection_id: &str) -> String {
    format!("W#{connection_id}")
}

pub const CONNECTION_OWNER_SK: &str = "U";

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
    fn conversation_item_sorts_next_to_members() {
        assert!(CONVERSATION_SK < member_sk("-").as_str());
        assert!(member_sk("zzzz@@@").as_str() < MEMBERS_END_SK);
        assert!(MEMBERS_END_SK < FIRST_MESSAGE_SK);
        assert!(client_msg_sk("0").as_str() > LAST_MESSAGE_SK);
    }
}
