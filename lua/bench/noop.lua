-- Floor: a script that does nothing, for benchmarks only.
--
-- One EVALSHA of it through the same client, callers and Redis as an admission measures
-- what a round trip to Redis costs by itself: no admission script can be faster.
-- No KEYS, no ARGV; returns 0.

return 0
