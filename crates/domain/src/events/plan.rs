//! The pure planning steps of the two stream consumers: grouping a batch's events by
//! conversation, cutting Kinesis records under the size limit (relay), coalescing read receipts
//! and light messages (fanout), and the partial-batch-failure bookkeeping both report to Lambda.

use std::collections::HashMap;

use super::{Event, EventBatch};
use crate::{ConversationId, UserId};

/// Which record of a batch Lambda must deliver again (ReportBatchItemFailures): the earliest one
/// that failed. Lambda resumes from it, so everything after it is retried too, in order, and
/// nothing before it is repeated.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchFailures {
    earliest: Option<usize>,
}

impl BatchFailures {
    /// Record `index` (position in the batch) failed.
    pub fn fail(&mut self, index: usize) {
        self.earliest = Some(self.earliest.map_or(index, |e| e.min(index)));
    }

    /// The record to report, if any failed.
    pub fn earliest(&self) -> Option<usize> {
        self.earliest
    }
}

/// One conversation's events of a batch, in order, each with the index of the record it came
/// from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationEvents {
    pub conversation_id: ConversationId,
    pub events: Vec<(Event, usize)>,
}

impl ConversationEvents {
    /// The earliest record this conversation's events came from: what to report if they fail.
    pub fn first_record(&self) -> usize {
        self.events.iter().map(|(_, i)| *i).min().unwrap_or(0)
    }

    pub fn into_events(self) -> Vec<Event> {
        self.events.into_iter().map(|(e, _)| e).collect()
    }
}

/// Groups events by conversation, keeping each conversation's order; conversations come in the
/// order they first appear.
pub fn group_by_conversation(
    events: impl IntoIterator<Item = (Event, usize)>,
) -> Vec<ConversationEvents> {
    let mut groups: Vec<ConversationEvents> = Vec::new();
    let mut index: HashMap<ConversationId, usize> = HashMap::new();
    for (event, record) in events {
        let id = event.conversation_id().clone();
        let slot = *index.entry(id.clone()).or_insert_with(|| {
            groups.push(ConversationEvents {
                conversation_id: id,
                events: Vec::new(),
            });
            groups.len() - 1
        });
        groups[slot].events.push((event, record));
    }
    groups
}

/// One Kinesis record of the relay: a conversation's events and the earliest stream record they
/// come from (what to report if the put fails).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingRecord {
    pub batch: EventBatch,
    pub first_record: usize,
}

/// Splits one conversation's events into records of at most `max_bytes` of events, in order.
pub fn chunk_by_size(group: ConversationEvents, max_bytes: usize) -> Vec<OutgoingRecord> {
    let mut out: Vec<OutgoingRecord> = Vec::new();
    let mut bytes = 0;
    for (event, record) in group.events {
        let size = serde_json::to_vec(&event).map_or(max_bytes, |v| v.len());
        match out.last_mut() {
            Some(last) if bytes + size <= max_bytes => last.batch.events.push(event),
            _ => {
                bytes = 0;
                out.push(OutgoingRecord {
                    batch: EventBatch {
                        conversation_id: group.conversation_id.clone(),
                        events: vec![event],
                    },
                    first_record: record,
                });
            }
        }
        bytes += size;
    }
    out
}

/// The relay's PutRecords rounds: round k holds the k-th record of every conversation, so no
/// call carries two records of one conversation (PutRecords does not order within a call) and a
/// conversation's records go out in order.
pub fn put_rounds(groups: Vec<ConversationEvents>, max_bytes: usize) -> Vec<Vec<OutgoingRecord>> {
    let mut rounds: Vec<Vec<OutgoingRecord>> = Vec::new();
    for group in groups {
        for (k, record) in chunk_by_size(group, max_bytes).into_iter().enumerate() {
            if rounds.len() <= k {
                rounds.push(Vec::new());
            }
            rounds[k].push(record);
        }
    }
    rounds
}

/// Within one batch only the highest watermark per member and conversation matters: drops every
/// `read.updated` that a later one of the same member supersedes, keeping everything else in order.
pub fn coalesce_reads(events: Vec<Event>) -> Vec<Event> {
    let mut best: HashMap<(ConversationId, crate::UserId), (usize, u64)> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if let Event::ReadUpdated {
            conversation_id,
            user_id,
            last_read_seq,
            ..
        } = e
        {
            let entry = best
                .entry((conversation_id.clone(), user_id.clone()))
                .or_insert((i, *last_read_seq));
            if *last_read_seq >= entry.1 {
                *entry = (i, *last_read_seq);
            }
        }
    }
    events
        .into_iter()
        .enumerate()
        .filter(|(i, e)| match e {
            Event::ReadUpdated {
                conversation_id,
                user_id,
                ..
            } => best
                .get(&(conversation_id.clone(), user_id.clone()))
                .is_some_and(|(keep, _)| keep == i),
            _ => true,
        })
        .map(|(_, e)| e)
        .collect()
}

/// The frames one conversation's events of a batch become for a conversation of `members`
/// members, sent to the connection `to` (its user and id; None: any): read receipts coalesced,
/// the events that came from that very connection left out (it has their answers: docs/api.md
/// §15.4), the light `message.new` above 200 members, consecutive light messages coalesced to the
/// last, and no `origin` in any of them.
pub fn frames_for(events: Vec<Event>, members: usize, to: Option<(&UserId, &str)>) -> Vec<Event> {
    let own = |e: &Event| to.is_some_and(|(user, connection)| e.is_from(user, connection));
    let events: Vec<Event> = coalesce_reads(events)
        .into_iter()
        .filter(|e| !own(e))
        .map(|e| e.for_audience(members).frame())
        .collect();
    if members > super::FULL_PUSH_MAX_MEMBERS {
        coalesce_light_messages(events)
    } else {
        events
    }
}

/// A light `message.new` says only "the conversation has reached `seq`", so of several in a row
/// only the last one matters: the client fetches everything after what it holds (`afterSeq`). A
/// `member.*` event ends a run, since those keep their place among the messages (docs/api.md
/// §15.3); read receipts do not (they may arrive before or after messages anyway). Full messages
/// carry content and are never dropped.
pub fn coalesce_light_messages(events: Vec<Event>) -> Vec<Event> {
    let light = |e: &Event| matches!(e, Event::MessageNew { body: None, .. });
    // Walking backwards: is there a later light message of this conversation in the same run?
    let mut later_in_run: HashMap<ConversationId, bool> = HashMap::new();
    let mut keep = vec![true; events.len()];
    for (i, e) in events.iter().enumerate().rev() {
        let run = later_in_run
            .entry(e.conversation_id().clone())
            .or_insert(false);
        match e {
            Event::MemberAdded { .. } | Event::MemberRemoved { .. } => *run = false,
            _ if light(e) => {
                keep[i] = !*run;
                *run = true;
            }
            _ => {}
        }
    }
    events
        .into_iter()
        .zip(keep)
        .filter_map(|(e, k)| k.then_some(e))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::fixtures::{msg, read, user};

    fn in_conversation(c: &str, e: Event) -> Event {
        let id = ConversationId::parse(c).unwrap();
        match e {
            Event::MessageNew { seq, .. } => Event::MessageNew {
                conversation_id: id,
                seq,
                sender_id: Some(user("u")),
                client_msg_id: None,
                body: None,
                created_at: None,
                version: None,
                edited_at: None,
                attachments: Vec::new(),
                origin: None,
            },
            other => other,
        }
    }

    fn big_message(seq: u64, body_bytes: usize) -> Event {
        match msg(seq) {
            Event::MessageNew {
                conversation_id,
                sender_id,
                client_msg_id,
                created_at,
                ..
            } => Event::MessageNew {
                conversation_id,
                seq,
                sender_id,
                client_msg_id,
                body: Some("x".repeat(body_bytes)),
                created_at,
                version: Some(1),
                edited_at: None,
                attachments: Vec::new(),
                origin: None,
            },
            _ => unreachable!(),
        }
    }

    fn seqs(events: &[Event]) -> Vec<u64> {
        events
            .iter()
            .map(|e| match e {
                Event::MessageNew { seq, .. } => *seq,
                _ => 0,
            })
            .collect()
    }

    #[test]
    fn batch_failures_report_the_earliest_record() {
        let mut f = BatchFailures::default();
        assert_eq!(f.earliest(), None);
        f.fail(7);
        f.fail(3);
        f.fail(5);
        assert_eq!(f.earliest(), Some(3));
    }

    #[test]
    fn grouping_keeps_each_conversations_order() {
        let a = "g-0000000000000000000000000000000a";
        let b = "g-0000000000000000000000000000000b";
        let groups = group_by_conversation(vec![
            (in_conversation(b, msg(1)), 0),
            (in_conversation(a, msg(1)), 1),
            (in_conversation(b, msg(2)), 2),
            (in_conversation(a, msg(2)), 4),
        ]);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].conversation_id.as_str(), b);
        assert_eq!(groups[0].first_record(), 0);
        assert_eq!(groups[1].first_record(), 1);
        assert_eq!(seqs(&groups[1].clone().into_events()), vec![1, 2]);
    }

    #[test]
    fn chunks_keep_order_and_the_size_limit() {
        let group = ConversationEvents {
            conversation_id: crate::events::fixtures::conversation(),
            events: vec![
                (big_message(1, 400_000), 0),
                (big_message(2, 400_000), 3),
                (big_message(3, 400_000), 7),
                (big_message(4, 10), 8),
            ],
        };
        let out = chunk_by_size(group.clone(), 900 * 1024);
        let chunk_seqs: Vec<Vec<u64>> = out.iter().map(|o| seqs(&o.batch.events)).collect();
        assert_eq!(chunk_seqs, vec![vec![1, 2], vec![3, 4]]);
        assert_eq!(
            out.iter().map(|o| o.first_record).collect::<Vec<_>>(),
            vec![0, 7]
        );
        for o in &out {
            assert!(serde_json::to_vec(&o.batch).unwrap().len() < 1024 * 1024);
        }
        let rounds = put_rounds(vec![group], 900 * 1024);
        assert_eq!(rounds.len(), 2, "the second chunk goes in a later call");
    }

    #[test]
    fn light_messages_are_coalesced_to_the_last_of_each_run() {
        let light = |seq| msg(seq).for_audience(201);
        let added = Event::MemberAdded {
            conversation_id: crate::events::fixtures::conversation(),
            user_ids: vec![user("n")],
        };
        let events = vec![
            msg(1),
            msg(2),
            read("a", 1),
            msg(3),
            added.clone(),
            msg(4),
            msg(5),
        ];
        // 201 members: light, runs cut by the member event.
        assert_eq!(
            frames_for(events.clone(), 201, None),
            vec![read("a", 1), light(3), added.clone(), light(5)]
        );
        // 200 members: full messages, every one of them.
        assert_eq!(frames_for(events.clone(), 200, None), events);
        // Full messages are never dropped, even if passed through.
        assert_eq!(
            coalesce_light_messages(vec![msg(1), msg(2)]),
            vec![msg(1), msg(2)]
        );
        // Another conversation's light message does not hide this one's.
        let other = in_conversation("g-0000000000000000000000000000000a", msg(9)).for_audience(201);
        assert_eq!(
            coalesce_light_messages(vec![light(1), other.clone()]),
            vec![light(1), other]
        );
    }

    #[test]
    fn a_connection_is_not_sent_what_came_from_it() {
        let from = |e: Event| e.from_origin(Some("c1=".into()));
        let events = vec![from(msg(1)), msg(2), read("u", 1), from(read("u", 2))];
        let (u, v) = (user("u"), user("v"));
        // The sending connection: neither its message nor its receipt, and the receipt it
        // superseded is gone too (coalesced first).
        assert_eq!(
            frames_for(events.clone(), 2, Some((&u, "c1="))),
            vec![msg(2)]
        );
        // The sender's other connection, and anyone else: all of it, without origins.
        let all = vec![msg(1), msg(2), read("u", 2)];
        assert_eq!(frames_for(events.clone(), 2, Some((&u, "c2="))), all);
        assert_eq!(frames_for(events.clone(), 2, Some((&v, "c1="))), all);
        assert_eq!(frames_for(events.clone(), 2, None), all);
        // Above 200 members too: the full event names its sender before it goes light.
        let light = |seq| msg(seq).for_audience(201);
        assert_eq!(
            frames_for(vec![msg(1), from(msg(2))], 201, Some((&u, "c1="))),
            vec![light(1)]
        );
        assert_eq!(
            frames_for(vec![msg(1), from(msg(2))], 201, Some((&u, "c2="))),
            vec![light(2)]
        );
    }

    #[test]
    fn coalescing_keeps_the_highest_read_per_member() {
        let events = vec![
            read("a", 1),
            msg(5),
            read("b", 2),
            read("a", 3),
            read("a", 2),
            msg(6),
        ];
        assert_eq!(
            coalesce_reads(events),
            vec![msg(5), read("b", 2), read("a", 3), msg(6)]
        );
    }
}
