-- Appends a usage record to the stream KEYS[1] (when ARGV[2] is 1; capped near ARGV[3]
-- entries) and adds to the day's sums KEYS[2], kept ARGV[4] seconds: one step, so the sums
-- always equal the records. ARGV[1]: the record; then (name, amount) pairs from ARGV[5].
if ARGV[2] == '1' then
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'r', ARGV[1])
end
for i = 5, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 0
