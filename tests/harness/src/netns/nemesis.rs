//! A seeded nemesis for the [`Testbed`]: one fault at a time, held for a few seconds, then
//! healed, with a pause between faults. Worker faults are aimed at the current leader most of
//! the time, since that is where a fault can cost a term. The same seed replays the same
//! choices (what the cluster does in between still varies).

use std::time::Duration;

use super::Testbed;
use crate::chaos::{mono_ns, Mark};

/// The faults, by the name they are logged and counted under.
pub const FAULTS: [&str; 6] = [
    "worker-cut",
    "etcd-leader-cut",
    "worker-member-minority",
    "lossy-slow-link",
    "worker-frozen",
    "member-killed",
];

/// What each fault does, for the report.
pub fn describe(fault: &str) -> &'static str {
    match fault {
        "worker-cut" => "a worker cut off from every member",
        "etcd-leader-cut" => "the etcd leader member cut off from the other members",
        "worker-member-minority" => "a worker isolated together with one member",
        "lossy-slow-link" => "a worker's link lossy (25 %) and slow",
        "worker-frozen" => "a whole worker frozen (SIGSTOP to its namespace), then SIGCONT",
        "member-killed" => "a member SIGKILLed, then restarted",
        _ => "",
    }
}

/// One fault as injected.
#[derive(Debug, Clone)]
pub struct Injected {
    pub fault: &'static str,
    /// `w1`, `m0`, `w2+m1`.
    pub target: String,
    /// Whether it hit the worker running the job at the time.
    pub at_leader: bool,
    pub begin_ns: i64,
    pub heal_ns: i64,
}

/// xorshift64*: deterministic per seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A duration between `lo` and `hi`, in 100 ms steps.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let steps = (hi.saturating_sub(lo).as_millis() / 100) as u64;
        lo + Duration::from_millis(100 * self.below(steps + 1))
    }
}

pub struct Nemesis {
    rng: Rng,
    pub start_ns: i64,
    pub log: Vec<Injected>,
    /// Workers restarted after their lead-exec exited (a fenced job ends its term).
    pub revived: usize,
}

impl Nemesis {
    pub fn new(seed: u64) -> Nemesis {
        Nemesis {
            rng: Rng::new(seed),
            start_ns: mono_ns(),
            log: Vec::new(),
            revived: 0,
        }
    }

    fn stamp(&self, ns: i64) -> String {
        format!("[{:>8.2} s]", (ns - self.start_ns) as f64 / 1e9)
    }

    /// Injects one fault, holds it 2 s to 2 × TTL + 2 s, heals it, then pauses 2–6 s.
    /// `say` gets one line at the fault and one at its heal.
    pub fn step(&mut self, tb: &mut Testbed, say: &mut dyn FnMut(&str)) -> Injected {
        let fault = FAULTS[self.rng.below(FAULTS.len() as u64) as usize];
        let hold = self
            .rng
            .between(Duration::from_secs(2), tb.ttl * 2 + Duration::from_secs(2));
        let pause = self
            .rng
            .between(Duration::from_secs(2), Duration::from_secs(6));
        let aim_at_leader = self.rng.below(4) != 0;
        let pick_worker = self.rng.below(tb.workers.len() as u64) as usize;
        let pick_member = self.rng.below(tb.members.len() as u64) as usize;
        let loss = 25;
        let current = tb.current();
        let worker = match current {
            Some((l, _)) if aim_at_leader => l,
            Some((l, _)) if pick_worker == l => (l + 1) % tb.workers.len(),
            _ => pick_worker,
        };
        let at_leader_worker = current.is_some_and(|(l, _)| l == worker);
        let wname = tb.workers[worker].node.name.clone();
        let member_names: Vec<String> = tb.members.iter().map(|m| m.node.name.clone()).collect();
        let begin_ns = mono_ns();
        let (target, at_leader) = match fault {
            "worker-cut" => {
                for m in &member_names {
                    tb.cut(&wname, m);
                }
                (wname.clone(), at_leader_worker)
            }
            "etcd-leader-cut" => {
                let l = tb.raft_leader().unwrap_or(pick_member);
                for (k, m) in member_names.iter().enumerate() {
                    if k != l {
                        tb.cut(&member_names[l], m);
                    }
                }
                (member_names[l].clone(), false)
            }
            "worker-member-minority" => {
                let mine = &member_names[pick_member];
                for m in member_names.iter().filter(|m| *m != mine) {
                    tb.cut(&wname, m);
                    tb.cut(mine, m);
                }
                let others: Vec<String> = tb
                    .workers
                    .iter()
                    .map(|w| w.node.name.clone())
                    .filter(|w| *w != wname)
                    .collect();
                for w in &others {
                    tb.cut(mine, w);
                }
                (format!("{wname}+{mine}"), at_leader_worker)
            }
            "lossy-slow-link" => {
                tb.lose(&wname, loss);
                tb.slow(&wname, 1000);
                (wname.clone(), at_leader_worker)
            }
            "worker-frozen" => {
                tb.freeze(worker, true);
                (wname.clone(), at_leader_worker)
            }
            _ => {
                tb.members[pick_member].kill();
                (member_names[pick_member].clone(), false)
            }
        };
        let leader_note = match current {
            Some((l, t)) => format!("job on {} token {t}", tb.workers[l].node.name),
            None => "no job running".into(),
        };
        say(&format!(
            "{} fault {:>3}: {fault:<22} {target:<7} for {:.1} s ({leader_note}{})",
            self.stamp(begin_ns),
            self.log.len() + 1,
            hold.as_secs_f64(),
            if at_leader { ", at the leader" } else { "" },
        ));
        std::thread::sleep(hold);
        match fault {
            "worker-frozen" => tb.freeze(worker, false),
            "member-killed" => tb.members[pick_member].restart(),
            _ => tb.heal_all(),
        }
        let heal_ns = mono_ns();
        tb.marks.push(Mark {
            name: format!("{fault} {target}"),
            begin_ns,
            heal_ns: Some(heal_ns),
            deposed_worker: (fault == "worker-frozen").then(|| wname.clone()),
            // Liveness is judged by the gap attribution instead (crate::liveness).
            expect_liveness: false,
        });
        say(&format!("{} healed {fault} {target}", self.stamp(heal_ns)));
        let inj = Injected {
            fault,
            target,
            at_leader,
            begin_ns,
            heal_ns,
        };
        self.log.push(inj.clone());
        std::thread::sleep(pause);
        let revived = tb.revive();
        if !revived.is_empty() {
            self.revived += revived.len();
            say(&format!(
                "{} restarted lead-exec on {} (it had exited)",
                self.stamp(mono_ns()),
                revived.join(", ")
            ));
        }
        inj
    }
}
