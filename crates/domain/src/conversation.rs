//! What a conversation allows (docs/api.md §6, §8, §9, §16): its kinds, the member bound, who may change its
//! membership, and the group title.

use serde::{Deserialize, Serialize};

use super::ids::{hex_digest, UserId};
use crate::error::ChatError;

/// Members per conversation, creator included.
pub const MAX_MEMBERS: usize = 1_000;
pub const MAX_TITLE_CHARS: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConversationType {
    Direct,
    Group,
}

/// A group title: 1–200 characters, any text.
pub fn check_title(title: &str) -> Result<(), ChatError> {
    let chars = title.chars().count();
    if chars == 0 || chars > MAX_TITLE_CHARS {
        return Err(ChatError::invalid(format!(
            "field `title` must be 1-{MAX_TITLE_CHARS} characters"
        )));
    }
    Ok(())
}

/// `409` once a conversation would have more than 1,000 members.
pub fn check_member_bound(members: usize) -> Result<(), ChatError> {
    if members > MAX_MEMBERS {
        return Err(ChatError::Conflict(format!(
            "a group has at most {MAX_MEMBERS} members"
        )));
    }
    Ok(())
}

/// The members of a new group: the creator first (its owner), then the others without repeats;
/// within the bound.
pub fn group_members(creator: &UserId, others: &[UserId]) -> Result<Vec<UserId>, ChatError> {
    let mut all = vec![creator.clone()];
    for u in others {
        if !all.contains(u) {
            all.push(u.clone());
        }
    }
    check_member_bound(all.len())?;
    Ok(all)
}

/// Only groups change membership; a direct conversation is its pair forever.
pub fn check_membership_change(kind: ConversationType) -> Result<(), ChatError> {
    match kind {
        ConversationType::Group => Ok(()),
        ConversationType::Direct => Err(ChatError::Conflict(
            "members of a direct conversation cannot change".into(),
        )),
    }
}

/// Who is added by an add-members request: those not yet members, in request order; the result
/// must stay within the bound. Any member may add.
pub fn members_to_add<'a>(
    existing: &[&str],
    requested: &'a [UserId],
) -> Result<Vec<&'a UserId>, ChatError> {
    let mut new: Vec<&UserId> = Vec::new();
    for u in requested {
        if !existing.contains(&u.as_str()) && !new.contains(&u) {
            new.push(u);
        }
    }
    check_member_bound(existing.len() + new.len())?;
    Ok(new)
}

/// Whether `caller` manages the group: its owner or one of its admins (docs/api.md §26). Managers
/// remove members, ban, delete others' messages and set slow mode.
pub fn is_manager(caller: &UserId, owner: Option<&UserId>, admins: &[UserId]) -> bool {
    owner == Some(caller) || admins.contains(caller)
}

/// A member may remove itself; the owner may remove anyone, the admins anyone but the owner (who
/// names and removes them: an admin removing it would leave the group without one who can).
pub fn check_removal(
    caller: &UserId,
    target: &UserId,
    owner: Option<&UserId>,
    admins: &[UserId],
) -> Result<(), ChatError> {
    if caller == target {
        return Ok(());
    }
    if owner == Some(target) {
        return Err(ChatError::Forbidden(
            "the group's owner cannot be removed; it may leave".into(),
        ));
    }
    if is_manager(caller, owner, admins) {
        Ok(())
    } else {
        Err(ChatError::Forbidden(
            "only the group's owner or an admin may remove other members".into(),
        ))
    }
}

/// Who may ban (or lift a ban on) `target` (docs/api.md §27): the owner and the admins, anyone
/// but the owner; nobody bans themselves (`400`).
pub fn check_ban(
    caller: &UserId,
    target: &UserId,
    owner: Option<&UserId>,
    admins: &[UserId],
) -> Result<(), ChatError> {
    if caller == target {
        return Err(ChatError::invalid(
            "path parameter `userId` is the caller: a user cannot ban themselves",
        ));
    }
    if !is_manager(caller, owner, admins) {
        return Err(ChatError::Forbidden(
            "only the group's owner or an admin may ban".into(),
        ));
    }
    if owner == Some(target) {
        return Err(ChatError::Forbidden(
            "the group's owner cannot be banned".into(),
        ));
    }
    Ok(())
}

/// Only the owner names and removes admins.
pub fn check_owner(caller: &UserId, owner: Option<&UserId>) -> Result<(), ChatError> {
    if owner == Some(caller) {
        Ok(())
    } else {
        Err(ChatError::Forbidden(
            "only the group's owner may change its admins".into(),
        ))
    }
}

/// Slow mode is set by the owner or an admin, of a group only, to 0–120 seconds.
pub fn check_slow_mode_change(
    caller: &UserId,
    kind: ConversationType,
    owner: Option<&UserId>,
    admins: &[UserId],
) -> Result<(), ChatError> {
    if kind == ConversationType::Direct {
        return Err(ChatError::Conflict(
            "a direct conversation has no slow mode".into(),
        ));
    }
    if !is_manager(caller, owner, admins) {
        return Err(ChatError::Forbidden(
            "only the group's owner or an admin may set slow mode".into(),
        ));
    }
    Ok(())
}

/// An add that names a banned user is refused whole (`403`): nobody is added.
pub fn check_not_banned(new: &[&UserId], banned: &[UserId]) -> Result<(), ChatError> {
    match new.iter().find(|u| banned.contains(u)) {
        Some(u) => Err(ChatError::Forbidden(format!(
            "user {u} is banned from this group"
        ))),
        None => Ok(()),
    }
}

/// A new member has read everything sent before it joined: its watermark starts at `lastSeq`.
pub fn joining_watermark(last_seq: u64) -> u64 {
    last_seq
}

/// What a resent group creation must match to count as the same request.
pub fn group_fingerprint(title: &str, members: &[UserId]) -> String {
    let mut ids: Vec<&str> = members.iter().map(UserId::as_str).collect();
    ids.sort_unstable();
    let mut parts = vec!["group-request", title];
    parts.extend(ids);
    hex_digest(&parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    fn users(n: usize) -> Vec<UserId> {
        (0..n).map(|i| u(&format!("m{i}"))).collect()
    }

    #[test]
    fn managers_are_the_owner_and_the_admins() {
        let (o, a, m) = (u("o"), u("a"), u("m"));
        let admins = vec![a.clone()];
        assert!(is_manager(&o, Some(&o), &admins));
        assert!(is_manager(&a, Some(&o), &admins));
        assert!(!is_manager(&m, Some(&o), &admins));
        assert!(!is_manager(&m, None, &[]));
        assert!(check_owner(&o, Some(&o)).is_ok());
        assert_eq!(check_owner(&a, Some(&o)).unwrap_err().status(), 403);
        let group = ConversationType::Group;
        assert!(check_slow_mode_change(&a, group, Some(&o), &admins).is_ok());
        let e = check_slow_mode_change(&m, group, Some(&o), &admins).unwrap_err();
        assert_eq!(e.status(), 403);
        let direct = ConversationType::Direct;
        let e = check_slow_mode_change(&o, direct, None, &[]).unwrap_err();
        assert_eq!(e.status(), 409);
    }

    #[test]
    fn titles() {
        assert!(check_title("T").is_ok());
        assert!(check_title(&"日".repeat(200)).is_ok());
        assert_eq!(check_title("").unwrap_err().status(), 400);
        let e = check_title(&"t".repeat(201)).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("title"));
    }

    #[test]
    fn group_members_put_the_creator_first_once() {
        let all = group_members(&u("c"), &[u("b"), u("c"), u("b"), u("a")]).unwrap();
        assert_eq!(all, vec![u("c"), u("b"), u("a")]);
        assert!(group_members(&u("c"), &users(999)).is_ok());
        assert_eq!(
            group_members(&u("c"), &users(1000)).unwrap_err().status(),
            409
        );
    }

    #[test]
    fn only_groups_change_membership() {
        assert!(check_membership_change(ConversationType::Group).is_ok());
        assert_eq!(
            check_membership_change(ConversationType::Direct)
                .unwrap_err()
                .status(),
            409
        );
    }

    #[test]
    fn adding_skips_members_and_keeps_the_bound() {
        let requested = [u("a"), u("x"), u("x"), u("y")];
        let new = members_to_add(&["a", "b"], &requested).unwrap();
        assert_eq!(new, vec![&u("x"), &u("y")]);
        assert!(members_to_add(&["a"], &[u("a")]).unwrap().is_empty());
        let existing: Vec<String> = (0..998).map(|i| format!("e{i}")).collect();
        let existing: Vec<&str> = existing.iter().map(String::as_str).collect();
        assert_eq!(
            members_to_add(&existing, &[u("x"), u("y")]).unwrap().len(),
            2
        );
        assert_eq!(
            members_to_add(&existing, &[u("x"), u("y"), u("z")])
                .unwrap_err()
                .status(),
            409
        );
    }

    #[test]
    fn removal_is_for_oneself_or_by_the_owner_or_an_admin() {
        let owner = u("o");
        assert!(check_removal(&u("m"), &u("m"), Some(&owner), &[]).is_ok());
        assert!(check_removal(&owner, &u("m"), Some(&owner), &[]).is_ok());
        assert!(check_removal(&owner, &owner, Some(&owner), &[]).is_ok());
        assert!(check_removal(&u("a"), &u("m"), Some(&owner), &[u("a")]).is_ok());
        assert!(check_removal(&u("a"), &u("b"), Some(&owner), &[u("a"), u("b")]).is_ok());
        let e = check_removal(&u("a"), &owner, Some(&owner), &[u("a")]).unwrap_err();
        assert_eq!(e.status(), 403, "an admin does not remove the owner");
        assert_eq!(
            check_removal(&u("m"), &u("n"), Some(&owner), &[u("a")])
                .unwrap_err()
                .status(),
            403
        );
        assert_eq!(
            check_removal(&u("m"), &u("n"), None, &[])
                .unwrap_err()
                .status(),
            403
        );
    }

    #[test]
    fn managers_ban_anyone_but_the_owner_and_never_themselves() {
        let (owner, admin) = (u("o"), u("a"));
        let admins = [admin.clone()];
        assert!(is_manager(&owner, Some(&owner), &[]));
        assert!(is_manager(&admin, Some(&owner), &admins));
        assert!(!is_manager(&u("m"), Some(&owner), &admins));
        assert!(check_ban(&owner, &u("m"), Some(&owner), &admins).is_ok());
        assert!(check_ban(&admin, &u("m"), Some(&owner), &admins).is_ok());
        let status =
            |c: &UserId, t: &UserId| check_ban(c, t, Some(&owner), &admins).unwrap_err().status();
        assert_eq!(status(&u("m"), &u("n")), 403, "a member");
        assert_eq!(status(&admin, &owner), 403, "the owner");
        assert_eq!(status(&owner, &owner), 400, "oneself");
        assert_eq!(status(&admin, &admin), 400, "oneself");
    }

    #[test]
    fn an_add_naming_a_banned_user_is_refused() {
        let (x, y) = (u("x"), u("y"));
        assert!(check_not_banned(&[&x], std::slice::from_ref(&y)).is_ok());
        let e = check_not_banned(&[&x, &y], std::slice::from_ref(&y)).unwrap_err();
        assert_eq!((e.status(), e.code()), (403, "forbidden"));
        assert!(e.to_string().contains('y'));
    }

    #[test]
    fn new_members_start_at_last_seq() {
        assert_eq!(joining_watermark(42), 42);
    }

    #[test]
    fn group_fingerprint_ignores_member_order() {
        assert_eq!(
            group_fingerprint("T", &[u("a"), u("b")]),
            group_fingerprint("T", &[u("b"), u("a")])
        );
        assert_ne!(
            group_fingerprint("T", &[u("a")]),
            group_fingerprint("U", &[u("a")])
        );
    }
}
