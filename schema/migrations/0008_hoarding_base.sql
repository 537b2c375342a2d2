-- 0008: each hoarding episode's totals over its minutes before a point (`base_through`, a
-- minute's first second), so that the next evaluation pass continues a long idle run from there
-- instead of reading its whole history again: before this, one allocation idle for a week made
-- every 15 s pass read a week of minute rows (BENCHMARKS.md, "The evaluation against the
-- hoarders' history"). The totals are those of `runs` over the minutes before the point: held
-- seconds, measured seconds, Σ SM activity, and the run's last held second before it.
-- NULL: the run started at or after the point, or the episode was stored before this migration;
-- a pass that would need them rescans from the episode's start instead.
ALTER TABLE hoarding_episodes ADD COLUMN base_through BIGINT;
ALTER TABLE hoarding_episodes ADD COLUMN base_held_seconds BIGINT;
ALTER TABLE hoarding_episodes ADD COLUMN base_sm_active_samples BIGINT;
ALTER TABLE hoarding_episodes ADD COLUMN base_sm_active_sum DOUBLE;
ALTER TABLE hoarding_episodes ADD COLUMN base_last_second BIGINT;
