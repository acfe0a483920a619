#!/usr/bin/env bash
# Run the settlement tick under leadership and branch on lead-exec's exit codes (the table in
# lead-exec-operations(7), "Exit codes").
#
# --every 5m: the run key is the UTC start of the five-minute period nearest to this worker's
# clock, the same on every worker, so the tick runs once per period even if a worker whose
# clock is late starts after the leader has finished. The job gets the key as
# LEAD_EXEC_RUN_KEY and the period's start as LEAD_EXEC_PERIOD_START. --timeout 4m: a tick
# that hangs is stopped before the next one is due.
set -u
lead-exec run settlement --no-wait --every 5m --timeout 4m -- /opt/settlement/bin/settle
code=$?
case $code in
  0)   echo "settlement: settled (or already settled this period by another worker)" ;;
  75)  echo "settlement: another worker leads; nothing to do" ;;
  76)  echo "settlement: leadership lost while running; the next leader continues" >&2 ;;
  79)  echo "settlement: this worker's health check fails; it did not take part" >&2 ;;
  64)  echo "settlement: bad lead-exec arguments" >&2; exit 2 ;;
  69)  echo "settlement: etcd unavailable; skipping this period" >&2 ;;
  70)  echo "settlement: lead-exec internal error (see its log); nothing was settled by it" >&2; exit 1 ;;
  77)  echo "settlement: etcd refused our credentials" >&2; exit 2 ;;
  124) echo "settlement: settle ran past --timeout 4m and was stopped; the period is not done" >&2; exit 1 ;;
  126|127) echo "settlement: settle is missing or not executable" >&2; exit 2 ;;
  *)   if [ "$code" -gt 128 ]; then
         echo "settlement: settle killed by signal $((code - 128))" >&2
       else
         echo "settlement: settle failed with exit code $code" >&2
       fi
       exit 1 ;;
esac
