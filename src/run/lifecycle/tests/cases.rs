use super::*;

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
fn a_term_lost_before_the_start_runs_nothing_and_is_recorded_as_not_started() {
    assert_requeued(
        started(TOKEN, StartEnd::NotStarted, &CAMPAIGN),
        TermEnd::NotStarted,
    );
    assert_ends(
        started(TOKEN, StartEnd::NotStarted, &EXIT),
        TermEnd::NotStarted,
        Exit::LeadershipLost,
    );
    assert!(
        TermEnd::NotStarted.is_clean(),
        "no job ran: nothing to wait out"
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
fn a_run_key_whose_attempts_are_all_made_ends_every_worker_with_80_and_no_record() {
    for policy in [&CAMPAIGN, &EXIT] {
        assert_eq!(
            started::<E>(TOKEN, StartEnd::Exhausted, policy),
            (Phase::Done(Exit::AttemptsExhausted), vec![REVOKE])
        );
    }
    assert_eq!(Exit::AttemptsExhausted.code(), 80);
}

#[test]
fn an_attempt_due_after_its_period_is_over_ends_as_not_acquired_without_a_record() {
    assert_eq!(
        started::<E>(TOKEN, StartEnd::PeriodOver, &CAMPAIGN),
        (
            Phase::Done(Exit::NotAcquired(Exit::DEFAULT_CONFLICT)),
            vec![REVOKE]
        )
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
        ran(job_ended(Exit::Signal(15), EndedBy::Job))[0],
        Action::RecordEnd(TermEnd::Exited(143))
    );
    assert_eq!(
        ran(job_ended(Exit::Signal(9), EndedBy::Deadline))[0],
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
        (StopReason::Preempted, false, TermEnd::Preempted),
        (StopReason::Preempted, true, TermEnd::LeaseLost),
        (StopReason::Unhealthy, false, TermEnd::Unhealthy),
        (StopReason::Interrupted(2), false, TermEnd::Signal(2)),
        (StopReason::Interrupted(2), true, TermEnd::LeaseLost),
        (StopReason::TimedOut, false, TermEnd::TimedOut),
    ];
    for (why, by_watchdog, reason) in cases {
        let by = if by_watchdog {
            EndedBy::Deadline
        } else {
            EndedBy::Job
        };
        let (_, a) = draining::<E>(TOKEN, why, lost_of(why), drained(by), &CAMPAIGN);
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
fn not_acquired_for_a_failing_health_check_exits_with_its_own_code() {
    let p = Policy {
        conflict_exit_code: 9,
        ..CAMPAIGN
    };
    assert_eq!(
        campaigned::<E>(0, CampaignEnd::NotAcquired { unhealthy: true }, &p),
        (Phase::Done(Exit::Unhealthy), vec![REVOKE])
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
        leading(TOKEN, job_ended(Exit::Job(7), EndedBy::Job), &CAMPAIGN),
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
        draining(TOKEN, why, lost_of(why), drained(EndedBy::Job), &EXIT),
        TermEnd::LeaseLost,
        Exit::LeadershipLost,
    );
}

#[test]
fn watchdog_kill_counts_as_loss_not_as_job_exit() {
    assert_requeued(
        leading(
            TOKEN,
            job_ended(Exit::Signal(9), EndedBy::Deadline),
            &CAMPAIGN,
        ),
        TermEnd::LeaseLost,
    );
}

#[test]
fn interrupt_while_leading_forwards_then_exits_with_job_code() {
    let (p, a) = leading::<E>(TOKEN, TermEvent::Signal(Arrived::Stop(2)), &CAMPAIGN);
    assert_eq!(a, vec![Action::StopJob { signal: 2 }]);
    let Phase::Draining { why, .. } = p else {
        panic!("{p:?}")
    };
    let (p2, a) = draining::<E>(
        TOKEN,
        why,
        lost_of(why),
        DrainEvent::Signal(Arrived::Stop(15)),
        &CAMPAIGN,
    );
    assert_eq!(a, vec![Action::KillJob]);
    let Phase::Draining { why, .. } = p2 else {
        panic!("{p2:?}")
    };
    let ev = DrainEvent::JobEnded {
        exit: Exit::Job(0),
        by: EndedBy::Job,
    };
    assert_ends(
        draining(TOKEN, why, lost_of(why), ev, &CAMPAIGN),
        TermEnd::Signal(15),
        Exit::Job(0),
    );
}

#[test]
fn usr_signals_reach_a_running_or_stopping_job_and_stop_nothing() {
    let usr1 = libc::SIGUSR1;
    assert_eq!(
        leading::<E>(TOKEN, TermEvent::Signal(Arrived::Forward(usr1)), &CAMPAIGN),
        (leading_phase(), vec![Action::Forward(usr1)])
    );
    let d = draining_phase(StopReason::Paused);
    assert_eq!(
        draining::<E>(
            TOKEN,
            StopReason::Paused,
            lost_of(StopReason::Paused),
            DrainEvent::Signal(Arrived::Forward(usr1)),
            &CAMPAIGN
        ),
        (d, vec![Action::Forward(usr1)])
    );
}

/// With no job yet, a signal for the job has nowhere to go: the delay goes on, its term kept,
/// and nothing is done.
#[test]
fn a_signal_for_the_job_while_no_job_runs_is_dropped_and_the_term_goes_on() {
    let usr1 = libc::SIGUSR1;
    assert_eq!(
        delaying::<E>(TOKEN, DelayEnd::Forwarded(usr1), &CAMPAIGN),
        (Phase::Delaying { token: TOKEN }, vec![])
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
        assert_requeued(
            draining(TOKEN, why, lost_of(why), drained(EndedBy::Job), &policy),
            record,
        );
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
            by: EndedBy::Job,
        };
        assert_ends(
            draining(TOKEN, why, lost_of(why), ok, &policy),
            TermEnd::TimedOut,
            Exit::TimedOut,
        );
        assert_ends(
            draining(
                TOKEN,
                why,
                lost_of(why),
                drained(EndedBy::Deadline),
                &policy,
            ),
            TermEnd::LeaseLost,
            Exit::TimedOut,
        );
    }
}

#[test]
fn a_stop_signal_during_the_timeouts_grace_kills_at_once_but_the_run_still_times_out() {
    for policy in [CAMPAIGN, EXIT] {
        let (p, a) = draining::<E>(
            TOKEN,
            StopReason::TimedOut,
            lost_of(StopReason::TimedOut),
            DrainEvent::Signal(Arrived::Stop(15)),
            &policy,
        );
        let why = StopReason::TimedOutThenInterrupted(15);
        assert_eq!((p, a), (draining_phase(why), vec![Action::KillJob]));
        // A third signal keeps the timeout too, and names the last signal.
        let (p2, a) = draining::<E>(
            TOKEN,
            why,
            lost_of(why),
            DrainEvent::Signal(Arrived::Stop(2)),
            &policy,
        );
        assert_eq!(p2, draining_phase(StopReason::TimedOutThenInterrupted(2)));
        assert_eq!(a, vec![Action::KillJob]);
        assert_ends(
            draining(TOKEN, why, lost_of(why), drained(EndedBy::Job), &policy),
            TermEnd::TimedOutThenSignal(15),
            Exit::TimedOut,
        );
        assert_ends(
            draining(
                TOKEN,
                why,
                lost_of(why),
                drained(EndedBy::Deadline),
                &policy,
            ),
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
        (draining_phase(StopReason::Preempted), vec![STOP])
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
            draining(TOKEN, why, lost_of(why), drained(EndedBy::Job), &policy),
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

#[test]
fn a_job_that_cannot_start_is_recorded_as_not_started_gives_the_lease_up_then_fails_the_run() {
    for policy in [CAMPAIGN, EXIT, NO_WAIT] {
        let (_, actions) = started(TOKEN, StartEnd::Failed("not found"), &policy);
        assert_eq!(
            actions,
            vec![
                Action::RecordEnd(TermEnd::NotStarted),
                REVOKE,
                Action::Fail("not found")
            ]
        );
    }
}

#[test]
fn a_refused_campaign_gives_the_lease_up_then_fails_the_run() {
    for policy in [CAMPAIGN, EXIT, NO_WAIT] {
        let (_, actions) = campaigned(0, CampaignEnd::Refused("other --slots"), &policy);
        assert_eq!(actions, vec![REVOKE, Action::Fail("other --slots")]);
    }
}

/// The watchdog killed the job at the lease's deadline before lead-exec saw its lease lost
/// (frozen, starved): the job's end is where the loss is learned, said and counted, as it is
/// on the way into draining when lead-exec sees it first; never twice for one term, and never
/// for a job killed because its watchdog died, with the lease in order.
#[test]
fn a_loss_is_learned_once_whether_lead_exec_or_its_watchdog_sees_it_first() {
    let deadline = Some(EndedBy::Deadline);
    let (next, _) = leading::<E>(
        TOKEN,
        job_ended(Exit::Signal(9), EndedBy::Deadline),
        &CAMPAIGN,
    );
    assert_eq!(
        loss_learned(leading_phase(), deadline, next),
        Some(Loss::Deadline)
    );
    let (next, _) = leading::<E>(TOKEN, TermEvent::Lost(Loss::KeyDeleted), &CAMPAIGN);
    let lost = draining_phase(StopReason::Lost(Loss::KeyDeleted));
    assert_eq!(next, lost);
    assert_eq!(
        loss_learned(leading_phase(), None, next),
        Some(Loss::KeyDeleted)
    );
    let (next, _) = draining::<E>(
        TOKEN,
        StopReason::Lost(Loss::KeyDeleted),
        lost_of(StopReason::Lost(Loss::KeyDeleted)),
        drained(EndedBy::Deadline),
        &EXIT,
    );
    assert_eq!(
        loss_learned(lost, deadline, next),
        None,
        "said on the way in"
    );
    // Stopping for another reason, the deadline passed before the job was gone.
    let paused = draining_phase(StopReason::Paused);
    let (next, _) = draining::<E>(
        TOKEN,
        StopReason::Paused,
        lost_of(StopReason::Paused),
        drained(EndedBy::Deadline),
        &CAMPAIGN,
    );
    assert_eq!(loss_learned(paused, deadline, next), Some(Loss::Deadline));
    let (next, _) = draining::<E>(
        TOKEN,
        StopReason::Paused,
        lost_of(StopReason::Paused),
        drained(EndedBy::Job),
        &CAMPAIGN,
    );
    assert_eq!(loss_learned(paused, Some(EndedBy::Job), next), None);
    // The watchdog died: the term is given up, but its lease was not lost.
    let gone = Some(EndedBy::WatchdogGone);
    let (next, _) = leading::<E>(
        TOKEN,
        job_ended(Exit::Signal(9), EndedBy::WatchdogGone),
        &CAMPAIGN,
    );
    assert_eq!(loss_learned(leading_phase(), gone, next), None);
}

/// A stop (systemctl stop) while a lost term's job is being stopped: the run ends as lost
/// (76, whatever the job exits with on the stop: a 0 must not pass for a success), the term is
/// recorded as lost, and the loss, said on the way in, is not learned again when the
/// watchdog's deadline kill is what ends the job.
#[test]
fn a_stop_while_a_lost_term_drains_ends_the_run_as_lost() {
    let lost = StopReason::Lost(Loss::Deadline);
    for policy in [CAMPAIGN, EXIT] {
        let stop = DrainEvent::Signal(Arrived::Stop(15));
        let (next, actions) = draining::<E>(TOKEN, lost, lost_of(lost), stop, &policy);
        let both = Phase::Draining {
            token: TOKEN,
            why: StopReason::Interrupted(15),
            lost: Some(Loss::Deadline),
        };
        assert_eq!((next, actions), (both, vec![Action::KillJob]));
        for by in [EndedBy::Job, EndedBy::Deadline] {
            for exit in [Exit::Job(0), Exit::Signal(9)] {
                let ev = DrainEvent::JobEnded { exit, by };
                let why = StopReason::Interrupted(15);
                let step = draining::<E>(TOKEN, why, Some(Loss::Deadline), ev, &policy);
                assert_eq!(loss_learned(both, Some(by), step.0), None);
                assert_ends(step, TermEnd::LeaseLost, Exit::LeadershipLost);
            }
        }
    }
}

/// etcd says the lease is gone while the job is being stopped for another reason (a pause, a
/// stop, --timeout): the next leader may already run, so the job gets SIGKILL at once instead
/// of the rest of its grace; the loss is learned then, and the term ends recorded as lost.
#[test]
fn a_lease_gone_while_the_job_is_being_stopped_cuts_the_grace_short() {
    for why in [
        StopReason::Paused,
        StopReason::Interrupted(15),
        StopReason::TimedOut,
        StopReason::Resigned,
    ] {
        let here = draining_phase(why);
        let (next, actions) =
            draining::<E>(TOKEN, why, None, DrainEvent::Lost(Loss::Expired), &CAMPAIGN);
        let lost = Phase::Draining {
            token: TOKEN,
            why,
            lost: Some(Loss::Expired),
        };
        assert_eq!((next, actions), (lost, vec![Action::KillJob]), "{why:?}");
        assert_eq!(loss_learned(here, None, next), Some(Loss::Expired));
        // Told again (the key's deletion after the lease's): no second kill, no second loss.
        let (again, actions) = draining::<E>(
            TOKEN,
            why,
            Some(Loss::Expired),
            DrainEvent::Lost(Loss::KeyDeleted),
            &CAMPAIGN,
        );
        assert_eq!((again, actions), (lost, vec![]), "{why:?}");
        assert_eq!(loss_learned(lost, None, again), None);
        let (_, actions) = draining::<E>(
            TOKEN,
            why,
            Some(Loss::Expired),
            drained(EndedBy::Job),
            &CAMPAIGN,
        );
        assert_eq!(actions[0], Action::RecordEnd(TermEnd::LeaseLost), "{why:?}");
    }
    // The key deleted, or the lease unrenewed: the stop under way goes on, within the
    // watchdog's deadline, and the term is known lost.
    for r in [Loss::KeyDeleted, Loss::Deadline] {
        let (next, actions) = draining::<E>(
            TOKEN,
            StopReason::Paused,
            None,
            DrainEvent::Lost(r),
            &CAMPAIGN,
        );
        assert_eq!(next.lost(), Some(r));
        assert_eq!(actions, vec![]);
    }
}
