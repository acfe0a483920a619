use super::*;
use proptest::prelude::*;

/// Errors in these tests are names.
type E = &'static str;

const CAMPAIGN: Policy = Policy {
    on_loss: OnLoss::Campaign,
    conflict_exit_code: 75,
    no_wait: false,
};
const EXIT: Policy = Policy {
    on_loss: OnLoss::Exit,
    conflict_exit_code: 75,
    no_wait: false,
};
const NO_WAIT: Policy = Policy {
    no_wait: true,
    ..CAMPAIGN
};

const TOKEN: i64 = 42;
const STOP: Action<E> = Action::StopJob { signal: SIGTERM };
const REVOKE: Action<E> = Action::RevokeLease;

fn campaigning() -> Phase {
    Phase::Campaigning { attempt: 0 }
}

fn leading_phase() -> Phase {
    Phase::Leading { token: TOKEN }
}

fn draining_phase(why: StopReason) -> Phase {
    Phase::Draining { token: TOKEN, why }
}

/// Any event of any phase, so that one list of phases and one of events cover them all.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Any {
    Campaign(CampaignEnd<E>),
    Backoff(BackoffEnd),
    Delay(DelayEnd),
    Start(StartEnd),
    Term(TermEvent),
    Drain(DrainEvent),
}

/// The step for `phase`, if `ev` is one of its events; `Done` has none.
fn step(phase: Phase, ev: Any, p: &Policy) -> Option<Step<E>> {
    Some(match (phase, ev) {
        (Phase::Campaigning { attempt }, Any::Campaign(e)) => campaigned(attempt, e, p),
        (Phase::BackingOff { attempt, .. }, Any::Backoff(e)) => backed_off(attempt, e),
        (Phase::Delaying { token }, Any::Delay(e)) => delaying(token, e, p),
        (Phase::Elected { token }, Any::Start(e)) => started(token, e, p),
        (Phase::Leading { token }, Any::Term(e)) => leading(token, e, p),
        (Phase::Draining { token, why }, Any::Drain(e)) => draining(token, why, e, p),
        _ => return None,
    })
}

fn job_ended(exit: Exit, by_watchdog: bool) -> TermEvent {
    TermEvent::JobEnded { exit, by_watchdog }
}

/// The job's group is gone after a SIGTERM.
fn drained(by_watchdog: bool) -> DrainEvent {
    DrainEvent::JobEnded {
        exit: Exit::Signal(15),
        by_watchdog,
    }
}

/// The run ends: the term's end recorded, the lease given up.
fn assert_ends(step: Step<E>, record: TermEnd, exit: Exit) {
    assert_eq!(
        step,
        (Phase::Done(exit), vec![Action::RecordEnd(record), REVOKE])
    );
}

/// Back in line: the end recorded, the lease given up, a fresh campaign.
fn assert_requeued(step: Step<E>, record: TermEnd) {
    assert_eq!(
        step,
        (campaigning(), vec![Action::RecordEnd(record), REVOKE])
    );
}

#[test]
fn elected_starts_the_job_with_the_token() {
    let ev = CampaignEnd::Elected {
        token: TOKEN,
        delay: false,
    };
    let (p, a) = campaigned::<E>(0, ev, &CAMPAIGN);
    assert_eq!((p, a), (Phase::Elected { token: TOKEN }, vec![]));
    assert_eq!(
        started::<E>(TOKEN, StartEnd::Spawned, &CAMPAIGN),
        (leading_phase(), vec![])
    );
}

#[test]
fn a_term_lost_before_the_start_runs_nothing_and_counts_as_lost() {
    assert_requeued(
        started(TOKEN, StartEnd::NotStarted, &CAMPAIGN),
        TermEnd::LeaseLost,
    );
    assert_ends(
        started(TOKEN, StartEnd::NotStarted, &EXIT),
        TermEnd::LeaseLost,
        Exit::LeadershipLost,
    );
}

#[test]
fn a_run_key_done_elsewhere_ends_with_success_and_no_record() {
    assert_eq!(
        started::<E>(TOKEN, StartEnd::AlreadyDone, &CAMPAIGN),
        (Phase::Done(Exit::Ok), vec![REVOKE])
    );
}

#[test]
fn no_wait_ends_on_an_etcd_failure_but_retries_a_lost_candidacy() {
    let (_, a) = campaigned(0, CampaignEnd::Failed(Cause::Etcd("down")), &NO_WAIT);
    assert_eq!(a, vec![REVOKE, Action::Fail("down")]);
    let lost = CampaignEnd::Failed(Cause::CandidacyLost(Loss::KeyDeleted));
    let (next, a) = campaigned::<E>(0, lost, &NO_WAIT);
    assert_eq!(
        next,
        Phase::BackingOff {
            attempt: 1,
            wait: backoff(0)
        }
    );
    assert_eq!(a, vec![REVOKE]);
}

#[test]
fn a_silent_lease_task_counts_as_a_deadline_loss() {
    assert_eq!(
        leading::<E>(TOKEN, TermEvent::LeaseTaskEnded, &CAMPAIGN),
        (draining_phase(StopReason::Lost(Loss::Deadline)), vec![STOP])
    );
}

#[test]
fn each_end_is_recorded_with_its_reason() {
    let ran = |ev| leading::<E>(TOKEN, ev, &CAMPAIGN).1;
    assert_eq!(
        ran(job_ended(Exit::Signal(15), false))[0],
        Action::RecordEnd(TermEnd::Exited(143))
    );
    assert_eq!(
        ran(job_ended(Exit::Signal(9), true))[0],
        Action::RecordEnd(TermEnd::LeaseLost)
    );
    let cases = [
        (
            StopReason::Lost(Loss::KeyDeleted),
            false,
            TermEnd::LeaseLost,
        ),
        (StopReason::Paused, false, TermEnd::Paused),
        (StopReason::Paused, true, TermEnd::LeaseLost),
        (StopReason::Resigned, false, TermEnd::Resigned),
        (StopReason::Unhealthy, false, TermEnd::Unhealthy),
        (StopReason::Interrupted(2), false, TermEnd::Signal(2)),
        (StopReason::Interrupted(2), true, TermEnd::LeaseLost),
        (StopReason::TimedOut, false, TermEnd::TimedOut),
    ];
    for (why, by_watchdog, reason) in cases {
        let (_, a) = draining::<E>(TOKEN, why, drained(by_watchdog), &CAMPAIGN);
        assert_eq!(a.first(), Some(&Action::RecordEnd(reason)), "{why:?}");
    }
}

#[test]
fn not_acquired_resigns_and_exits_with_conflict_code() {
    let p = Policy {
        conflict_exit_code: 9,
        ..CAMPAIGN
    };
    assert_eq!(
        campaigned::<E>(0, CampaignEnd::NotAcquired { unhealthy: false }, &p),
        (Phase::Done(Exit::NotAcquired(9)), vec![REVOKE])
    );
}

#[test]
fn failed_campaign_reports_backs_off_then_campaigns() {
    let (p, a) = campaigned(2, CampaignEnd::Failed(Cause::Etcd("down")), &CAMPAIGN);
    assert_eq!(
        p,
        Phase::BackingOff {
            attempt: 3,
            wait: backoff(2)
        }
    );
    assert_eq!(a, vec![REVOKE, Action::Report("down")]);
    assert_eq!(
        backed_off::<E>(3, BackoffEnd::Done),
        (Phase::Campaigning { attempt: 3 }, vec![])
    );
}

#[test]
fn backoff_grows_and_is_capped() {
    assert_eq!(backoff(0), Duration::from_millis(250));
    assert_eq!(backoff(1), Duration::from_millis(500));
    assert_eq!(backoff(30), Duration::from_secs(2));
}

#[test]
fn interrupt_while_campaigning_or_backing_off_exits_128_plus_n() {
    let ev = CampaignEnd::Interrupted { signal: 15 };
    assert_eq!(
        campaigned::<E>(0, ev, &CAMPAIGN),
        (Phase::Done(Exit::Signal(15)), vec![REVOKE])
    );
    assert_eq!(
        backed_off::<E>(1, BackoffEnd::Interrupted { signal: 15 }),
        (Phase::Done(Exit::Signal(15)), vec![])
    );
}

#[test]
fn job_exit_resigns_and_passes_the_code() {
    assert_ends(
        leading(TOKEN, job_ended(Exit::Job(7), false), &CAMPAIGN),
        TermEnd::Exited(7),
        Exit::Job(7),
    );
}

#[test]
fn a_lease_etcd_says_is_gone_kills_the_job_at_once() {
    assert_eq!(
        leading::<E>(TOKEN, TermEvent::Lost(Loss::Expired), &CAMPAIGN),
        (
            draining_phase(StopReason::Lost(Loss::Expired)),
            vec![Action::KillJob]
        )
    );
}

#[test]
fn loss_with_on_loss_exit_exits_76() {
    let (p, _) = leading::<E>(TOKEN, TermEvent::Lost(Loss::KeyDeleted), &EXIT);
    let Phase::Draining { why, .. } = p else {
        panic!("{p:?}")
    };
    assert_ends(
        draining(TOKEN, why, drained(false), &EXIT),
        TermEnd::LeaseLost,
        Exit::LeadershipLost,
    );
}

#[test]
fn watchdog_kill_counts_as_loss_not_as_job_exit() {
    assert_requeued(
        leading(TOKEN, job_ended(Exit::Signal(9), true), &CAMPAIGN),
        TermEnd::LeaseLost,
    );
}

#[test]
fn interrupt_while_leading_forwards_then_exits_with_job_code() {
    let (p, a) = leading::<E>(TOKEN, TermEvent::Signal(2), &CAMPAIGN);
    assert_eq!(a, vec![Action::StopJob { signal: 2 }]);
    let Phase::Draining { why, .. } = p else {
        panic!("{p:?}")
    };
    let (p2, a) = draining::<E>(TOKEN, why, DrainEvent::Signal(15), &CAMPAIGN);
    assert_eq!(a, vec![Action::KillJob]);
    let Phase::Draining { why, .. } = p2 else {
        panic!("{p2:?}")
    };
    let ev = DrainEvent::JobEnded {
        exit: Exit::Job(0),
        by_watchdog: false,
    };
    assert_ends(
        draining(TOKEN, why, ev, &CAMPAIGN),
        TermEnd::Signal(15),
        Exit::Job(0),
    );
}

#[test]
fn usr_signals_reach_a_running_or_stopping_job_and_stop_nothing() {
    let usr1 = libc::SIGUSR1;
    assert_eq!(
        leading::<E>(TOKEN, TermEvent::Signal(usr1), &CAMPAIGN),
        (leading_phase(), vec![Action::Forward(usr1)])
    );
    let d = draining_phase(StopReason::Paused);
    assert_eq!(
        draining::<E>(
            TOKEN,
            StopReason::Paused,
            DrainEvent::Signal(usr1),
            &CAMPAIGN
        ),
        (d, vec![Action::Forward(usr1)])
    );
}

#[test]
fn a_loss_a_pause_or_a_resign_stops_the_job_then_requeues() {
    let cases = [
        (
            TermEvent::Lost(Loss::Deadline),
            StopReason::Lost(Loss::Deadline),
            CAMPAIGN,
            TermEnd::LeaseLost,
        ),
        (TermEvent::Paused, StopReason::Paused, EXIT, TermEnd::Paused),
        (
            TermEvent::ResignRequested,
            StopReason::Resigned,
            EXIT,
            TermEnd::Resigned,
        ),
    ];
    for (ev, why, policy, record) in cases {
        assert_eq!(
            leading::<E>(TOKEN, ev, &policy),
            (draining_phase(why), vec![STOP])
        );
        assert_requeued(draining(TOKEN, why, drained(false), &policy), record);
    }
}

#[test]
fn a_job_past_its_timeout_is_stopped_then_the_term_ends_with_124_and_no_success() {
    let why = StopReason::TimedOut;
    for policy in [CAMPAIGN, EXIT] {
        assert_eq!(
            leading::<E>(TOKEN, TermEvent::TimedOut, &policy),
            (draining_phase(why), vec![STOP])
        );
        // Whatever the job exits with (0 included), it is not recorded as a success.
        let ok = DrainEvent::JobEnded {
            exit: Exit::Job(0),
            by_watchdog: false,
        };
        assert_ends(
            draining(TOKEN, why, ok, &policy),
            TermEnd::TimedOut,
            Exit::TimedOut,
        );
        assert_ends(
            draining(TOKEN, why, drained(true), &policy),
            TermEnd::LeaseLost,
            Exit::TimedOut,
        );
    }
}

#[test]
fn a_stop_signal_during_the_timeouts_grace_kills_at_once_but_the_run_still_times_out() {
    for policy in [CAMPAIGN, EXIT] {
        let (p, a) = draining::<E>(TOKEN, StopReason::TimedOut, DrainEvent::Signal(15), &policy);
        let why = StopReason::TimedOutThenInterrupted(15);
        assert_eq!((p, a), (draining_phase(why), vec![Action::KillJob]));
        // A third signal keeps the timeout too, and names the last signal.
        let (p2, a) = draining::<E>(TOKEN, why, DrainEvent::Signal(2), &policy);
        assert_eq!(p2, draining_phase(StopReason::TimedOutThenInterrupted(2)));
        assert_eq!(a, vec![Action::KillJob]);
        assert_ends(
            draining(TOKEN, why, drained(false), &policy),
            TermEnd::TimedOutThenSignal(15),
            Exit::TimedOut,
        );
        assert_ends(
            draining(TOKEN, why, drained(true), &policy),
            TermEnd::LeaseLost,
            Exit::TimedOut,
        );
    }
    assert_eq!(
        TermEnd::TimedOutThenSignal(15).to_string(),
        "timed out, then signal 15 to lead-exec"
    );
    assert!(TermEnd::TimedOutThenSignal(15).is_clean());
}

#[test]
fn an_unclean_end_delays_the_start_and_a_stop_during_the_delay_runs_nothing() {
    let ev = CampaignEnd::Elected {
        token: TOKEN,
        delay: true,
    };
    let (p, a) = campaigned::<E>(0, ev, &CAMPAIGN);
    assert_eq!((p, a), (Phase::Delaying { token: TOKEN }, vec![]));
    assert_eq!(
        delaying::<E>(TOKEN, DelayEnd::Done, &CAMPAIGN),
        (Phase::Elected { token: TOKEN }, vec![])
    );
    for ev in [
        DelayEnd::Paused,
        DelayEnd::ResignRequested,
        DelayEnd::Unhealthy,
    ] {
        assert_eq!(
            delaying::<E>(TOKEN, ev, &EXIT),
            (campaigning(), vec![REVOKE]),
            "{ev:?}"
        );
    }
    let (next, a) = delaying::<E>(TOKEN, DelayEnd::Lost(Loss::Expired), &EXIT);
    assert_eq!((next, a), (Phase::Done(Exit::LeadershipLost), vec![REVOKE]));
}

#[test]
fn a_handover_request_waits_for_min_term_and_lapses_with_its_candidate() {
    let left = Duration::from_secs(3);
    let ask = TermEvent::HandoverAsked {
        min_term_left: left,
    };
    assert_eq!(
        leading::<E>(TOKEN, ask, &CAMPAIGN),
        (leading_phase(), vec![Action::HandOverIn(left)])
    );
    assert_eq!(
        leading::<E>(TOKEN, TermEvent::Outranked(Some(true)), &CAMPAIGN),
        (draining_phase(StopReason::Resigned), vec![STOP])
    );
    assert_eq!(
        leading::<E>(TOKEN, TermEvent::Outranked(Some(false)), &CAMPAIGN),
        (leading_phase(), vec![Action::KeepTerm])
    );
    assert_eq!(
        leading::<E>(TOKEN, TermEvent::Outranked(None), &CAMPAIGN),
        (leading_phase(), vec![Action::HandOverIn(HANDOVER_RETRY)])
    );
    // Before the job starts, a handover costs nothing: no --min-term, and no waiting on etcd.
    let delay = Phase::Delaying { token: TOKEN };
    assert_eq!(
        delaying::<E>(TOKEN, DelayEnd::HandoverAsked, &CAMPAIGN),
        (delay, vec![Action::HandOverIn(Duration::ZERO)])
    );
    assert_eq!(
        delaying::<E>(TOKEN, DelayEnd::Outranked(Some(false)), &CAMPAIGN),
        (delay, vec![Action::KeepTerm])
    );
    for r in [Some(true), None] {
        assert_eq!(
            delaying::<E>(TOKEN, DelayEnd::Outranked(r), &CAMPAIGN),
            (campaigning(), vec![REVOKE])
        );
    }
}

#[test]
fn an_unhealthy_leader_stops_its_job_records_it_and_requeues() {
    for policy in [CAMPAIGN, EXIT] {
        let why = StopReason::Unhealthy;
        assert_eq!(
            leading::<E>(TOKEN, TermEvent::Unhealthy, &policy),
            (draining_phase(why), vec![STOP])
        );
        assert_requeued(
            draining(TOKEN, why, drained(false), &policy),
            TermEnd::Unhealthy,
        );
    }
}

#[test]
fn a_leader_found_unhealthy_before_its_start_gives_the_term_up_without_a_job() {
    for policy in [CAMPAIGN, EXIT] {
        assert_requeued(
            started(TOKEN, StartEnd::Unhealthy, &policy),
            TermEnd::Unhealthy,
        );
    }
}

#[test]
fn an_unhealthy_candidate_leaves_the_line() {
    assert_eq!(
        campaigned::<E>(0, CampaignEnd::Unhealthy, &CAMPAIGN),
        (campaigning(), vec![REVOKE])
    );
}

const SIGNAL: i32 = libc::SIGINT;

/// One of each event of every phase (and each payload that steers a transition).
fn all_events() -> Vec<Any> {
    let mut v: Vec<Any> = vec![
        Any::Campaign(CampaignEnd::Elected {
            token: 43,
            delay: false,
        }),
        Any::Campaign(CampaignEnd::Elected {
            token: 43,
            delay: true,
        }),
        Any::Campaign(CampaignEnd::Unhealthy),
        Any::Campaign(CampaignEnd::NotAcquired { unhealthy: false }),
        Any::Campaign(CampaignEnd::Failed(Cause::Etcd("down"))),
        Any::Campaign(CampaignEnd::Interrupted { signal: SIGNAL }),
        Any::Backoff(BackoffEnd::Done),
        Any::Backoff(BackoffEnd::Interrupted { signal: SIGNAL }),
        Any::Delay(DelayEnd::Done),
        Any::Delay(DelayEnd::LeaseTaskEnded),
        Any::Delay(DelayEnd::Paused),
        Any::Delay(DelayEnd::ResignRequested),
        Any::Delay(DelayEnd::Unhealthy),
        Any::Delay(DelayEnd::Interrupted { signal: SIGNAL }),
        Any::Delay(DelayEnd::HandoverAsked),
        Any::Start(StartEnd::Spawned),
        Any::Start(StartEnd::NotStarted),
        Any::Start(StartEnd::AlreadyDone),
        Any::Start(StartEnd::Unhealthy),
        Any::Term(TermEvent::LeaseTaskEnded),
        Any::Term(TermEvent::Paused),
        Any::Term(TermEvent::ResignRequested),
        Any::Term(TermEvent::TimedOut),
        Any::Term(TermEvent::Unhealthy),
        Any::Term(TermEvent::HandoverAsked {
            min_term_left: Duration::from_secs(1),
        }),
    ];
    let losses = [Loss::Expired, Loss::Deadline, Loss::KeyDeleted];
    for r in losses {
        v.push(Any::Campaign(CampaignEnd::Failed(Cause::CandidacyLost(r))));
        v.push(Any::Delay(DelayEnd::Lost(r)));
        v.push(Any::Term(TermEvent::Lost(r)));
    }
    for o in [Some(true), Some(false), None] {
        v.push(Any::Delay(DelayEnd::Outranked(o)));
        v.push(Any::Term(TermEvent::Outranked(o)));
    }
    for s in [SIGNAL, libc::SIGTERM, libc::SIGUSR1] {
        v.push(Any::Term(TermEvent::Signal(s)));
        v.push(Any::Drain(DrainEvent::Signal(s)));
    }
    for by_watchdog in [false, true] {
        for exit in [Exit::Job(0), Exit::Job(3), Exit::Signal(9)] {
            v.push(Any::Term(TermEvent::JobEnded { exit, by_watchdog }));
            v.push(Any::Drain(DrainEvent::JobEnded { exit, by_watchdog }));
        }
    }
    v
}

/// One of each phase (and each reason to drain).
fn all_phases() -> Vec<Phase> {
    let mut v = vec![
        Phase::Campaigning { attempt: 1 },
        Phase::BackingOff {
            attempt: 1,
            wait: backoff(0),
        },
        Phase::Delaying { token: TOKEN },
        Phase::Elected { token: TOKEN },
        leading_phase(),
        Phase::Done(Exit::Job(0)),
    ];
    v.extend(
        [
            StopReason::Lost(Loss::Expired),
            StopReason::Lost(Loss::Deadline),
            StopReason::Paused,
            StopReason::Resigned,
            StopReason::Interrupted(libc::SIGTERM),
            StopReason::TimedOut,
            StopReason::TimedOutThenInterrupted(libc::SIGTERM),
            StopReason::Unhealthy,
        ]
        .map(draining_phase),
    );
    v
}

fn all_policies() -> Vec<Policy> {
    let no_wait = |p: Policy| Policy { no_wait: true, ..p };
    vec![CAMPAIGN, EXIT, no_wait(CAMPAIGN), no_wait(EXIT)]
}

/// What must hold for any one transition.
fn check_transition(
    phase: Phase,
    ev: Any,
    next: Phase,
    actions: &[Action<E>],
) -> Result<(), String> {
    let t = format!("{phase:?} --{ev:?}--> {next:?} {actions:?}");
    let fail = |what: &str| Err(format!("{what}: {t}"));
    // A job is started only by a won campaign (after its takeover delay, if any).
    if matches!(next, Phase::Elected { .. })
        && !matches!(phase, Phase::Campaigning { .. } | Phase::Delaying { .. })
    {
        return fail("a start outside an election");
    }
    // A job is running only after it started.
    if matches!(next, Phase::Leading { .. })
        && !matches!(phase, Phase::Leading { .. })
        && !(matches!(phase, Phase::Elected { .. }) && ev == Any::Start(StartEnd::Spawned))
    {
        return fail("leading without a start");
    }
    // A stop is never revived: a draining term ends only with its job.
    if matches!(phase, Phase::Draining { .. }) && matches!(next, Phase::Leading { .. }) {
        return fail("a stop was revived");
    }
    // A term whose job may run is left only once the job is gone.
    let job_ended = matches!(
        ev,
        Any::Term(TermEvent::JobEnded { .. }) | Any::Drain(DrainEvent::JobEnded { .. })
    );
    if phase.has_job() && !next.has_job() && !job_ended {
        return fail("a term left while its job may run");
    }
    // A failure is the last action.
    if let Some(i) = actions.iter().position(|a| matches!(a, Action::Fail(_))) {
        if i + 1 != actions.len() {
            return fail("a failure that does not end the run");
        }
    }
    // Leaving the candidacy (for a new campaign, a backoff, or for good) gives up the lease,
    // so that the next candidate takes over at once; staying keeps it.
    let revokes = actions
        .iter()
        .filter(|a| **a == Action::RevokeLease)
        .count();
    let left =
        phase.has_lease() && (!next.has_lease() || matches!(next, Phase::Campaigning { .. }));
    let failed = actions.iter().any(|a| matches!(a, Action::Fail(_)));
    if (left || failed) != (revokes == 1) || revokes > 1 {
        return fail("the lease given up other than once on leaving the candidacy");
    }
    if let Some(i) = actions
        .iter()
        .position(|a| matches!(a, Action::Fail(_) | Action::Report(_)))
    {
        if !actions[..i].contains(&Action::RevokeLease) {
            return fail("a failure reported before the lease was given up");
        }
    }
    // An end record only when a term ends, and first, while our key still guards it.
    if let Some(i) = actions
        .iter()
        .position(|a| matches!(a, Action::RecordEnd(_)))
    {
        if i != 0 || phase.token().is_none() || next.token().is_some() {
            return fail("an end record outside a term's end");
        }
    }
    // A job's tokens come from its own election.
    if let (Some(a), Some(b)) = (phase.token(), next.token()) {
        if a != b {
            return fail("the token changed within a term");
        }
    }
    // Only a job gets signals, and only a running one is stopped.
    for a in actions {
        let ok = match a {
            Action::Forward(_) | Action::KillJob => phase.has_job(),
            Action::StopJob { .. } => matches!(phase, Phase::Leading { .. }),
            Action::HandOverIn(_) | Action::KeepTerm => {
                next == phase && matches!(phase, Phase::Leading { .. } | Phase::Delaying { .. })
            }
            _ => true,
        };
        if !ok {
            return fail("an action outside its phase");
        }
    }
    Ok(())
}

#[test]
fn every_phase_and_its_events_keep_the_invariants() {
    let mut pairs = 0;
    for p in all_policies() {
        for phase in all_phases() {
            for ev in all_events() {
                let Some((next, actions)) = step(phase, ev, &p) else {
                    continue;
                };
                if let Err(e) = check_transition(phase, ev, next, &actions) {
                    panic!("{e} (policy {p:?})");
                }
                pairs += 1;
            }
        }
    }
    assert!(pairs >= 4 * 100, "{pairs}");
}

proptest! {
    // A failure prints its minimal input; no regressions file is written into the tree.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Any sequence of events, each one the current phase can be told: each transition keeps
    /// the invariants, a job runs at most once per won election, and a run that ended stays
    /// ended.
    #[test]
    fn any_event_sequence_keeps_the_invariants(
        picks in proptest::collection::vec(any::<usize>(), 0..80),
        on_exit in any::<bool>(),
        no_wait in any::<bool>(),
    ) {
        let p = Policy {
            on_loss: if on_exit { OnLoss::Exit } else { OnLoss::Campaign },
            conflict_exit_code: 75,
            no_wait,
        };
        let events = all_events();
        let mut phase = campaigning();
        let mut starts_this_term = 0;
        for pick in picks {
            let told: Vec<Any> = events.iter().copied().filter(|ev| step(phase, *ev, &p).is_some()).collect();
            if told.is_empty() {
                // Done: nothing is waited for any more.
                prop_assert!(matches!(phase, Phase::Done(_)), "{phase:?} waits for nothing");
                break;
            }
            let ev = told[pick % told.len()];
            let (next, actions) = step(phase, ev, &p).unwrap_or_else(|| unreachable!());
            prop_assert!(check_transition(phase, ev, next, &actions).is_ok(),
                "{}", check_transition(phase, ev, next, &actions).unwrap_err());
            if next.token().is_none() {
                starts_this_term = 0;
            }
            if matches!(next, Phase::Leading { .. }) && !matches!(phase, Phase::Leading { .. }) {
                starts_this_term += 1;
                prop_assert!(starts_this_term == 1, "a second job in one term");
            }
            // After a failure the driver is gone: nothing may follow it.
            if actions.iter().any(|a| matches!(a, Action::Fail(_))) {
                break;
            }
            phase = next;
        }
    }
}
