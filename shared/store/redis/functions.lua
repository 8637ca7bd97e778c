#!lua name=pivirt
--[[
  The pivirt Redis function library, loaded by every process on (re)connect with
  FUNCTION LOAD REPLACE. Every multi-key update of the system is one of these functions, so it
  is atomic. Errors are returned as redis.error_reply('<CODE> <message>') with a gRPC status
  code name first; pv_redis maps them back to codes.
]]

-- pv_heartbeat(KEYS[1]=presence key, [KEYS[2]=index zset], ARGV[1]=ttl ms, ARGV[2]=value,
-- [ARGV[3]=member]): one TTL'd presence key of a process (gateway, worker, scheduler, node
-- agent). With an index, the member is also kept in a sorted set scored by its expiry time, and
-- expired members are dropped from it, so the live set of a kind is one ZRANGEBYSCORE away
-- (no SCAN over the keyspace). Returns 1 when the key was new (the process appeared), 0 when it
-- was refreshed.
redis.register_function('pv_heartbeat', function(keys, args)
  local ttl = tonumber(args[1])
  if not ttl or ttl <= 0 then
    return redis.error_reply('INVALID_ARGUMENT ttl must be a positive number of ms, got ' .. tostring(args[1]))
  end
  local existed = redis.call('EXISTS', keys[1])
  redis.call('SET', keys[1], args[2], 'PX', ttl)
  if keys[2] then
    if not args[3] or args[3] == '' then
      return redis.error_reply('INVALID_ARGUMENT an index needs a member name')
    end
    local now = now_ms()
    redis.call('ZADD', keys[2], now + ttl, args[3])
    redis.call('ZREMRANGEBYSCORE', keys[2], '-inf', '(' .. now)
  end
  if existed == 1 then return 0 end
  return 1
end)

-- pv_presence_leave(KEYS[1]=presence key, KEYS[2]=index zset, ARGV[1]=member): a process that
-- stops cleanly says so at once instead of waiting for its key to expire.
redis.register_function('pv_presence_leave', function(keys, args)
  redis.call('DEL', keys[1])
  redis.call('ZREM', keys[2], args[1])
  return 1
end)

-- pv_presence_live(KEYS[1]=index zset): the members whose presence has not expired.
redis.register_function{function_name = 'pv_presence_live', flags = {'no-writes'},
  callback = function(keys, args)
    return redis.call('ZRANGEBYSCORE', keys[1], '(' .. now_ms(), '+inf')
  end}

--[[ -------------------------------------------------------------------------------------------
  Operations (shared/store/pv_op.c; the key schema and the record fields are in shared/store/pv_op.h).

  Conventions of every pv_op_* function:
  - ARGV[1] is the key base "<prefix>{ops}:". Every key of the pipeline starts with it, so they
    all live in one hash slot.
  - KEYS declare the keys a call is about: its record, its queue stream, the index, the events
    stream, its lock keys. Keys reached through the value of another key (the operation an
    idempotency key or a lock names, the due operations of the delayed set, the whole pipeline
    for pv_op_check) cannot be known before the call; they are built from the base, in the same
    slot.
  - A reply that carries a record gives it as a flat field/value array (HGETALL style, journal
    fields left out), so one C parser serves every function.
  - A record stores only the fields that differ from OP_DEFAULTS: a new record is about half the
    size, which makes every HSET/HMGET on it cheaper (a small hash is a listpack, searched
    linearly). op_load gives absent fields their default, and so does the C parser.
  - A function that must release locks its caller did not declare (the caller knew only the
    operation id) writes nothing and answers {'need_locks', target, holds}; pv_op.c calls again
    with those lock keys.
  - Worker writes are fenced: they carry the token drawn by pv_op_acquire and are refused with
    ABORTED, writing nothing, unless it is still the record's token and the record is RUNNING.
------------------------------------------------------------------------------------------- ]]

local GROUP = 'workers' -- PV_OP_GROUP: the consumer group of every queue stream

local OP_FIELDS = {
  'id', 'kind', 'target', 'queue', 'status', 'progress', 'message', 'error_code',
  'error_message', 'created_ms', 'updated_ms', 'started_ms', 'finished_ms', 'attempts',
  'max_attempts', 'worker', 'request_id', 'cancel_requested', 'params', 'metadata', 'holds',
  'token', 'lease_until_ms', 'entry', 'retry_at_ms', 'last_error_code', 'last_error_message',
  'handed', 'target_unlocked',
}

local DONE = {SUCCEEDED = true, FAILED = true, CANCELLED = true}

-- The value of a field the record does not store (see the conventions above).
local OP_DEFAULTS = {
  progress = '0', message = '', error_code = '0', error_message = '', started_ms = '0',
  finished_ms = '0', attempts = '0', worker = '', request_id = '', cancel_requested = '0',
  holds = '[]', token = '0', lease_until_ms = '0', entry = '', retry_at_ms = '0', handed = '',
  target_unlocked = '',
}

-- The fields a reply carries: those of a pv_op (shared/store/pv_op.c); token, lease and the like stay
-- in Redis, so replies are smaller to build and to send.
local REPLY_FIELDS = {
  'id', 'kind', 'target', 'queue', 'status', 'progress', 'message', 'error_code',
  'error_message', 'created_ms', 'updated_ms', 'started_ms', 'finished_ms', 'attempts',
  'max_attempts', 'worker', 'request_id', 'cancel_requested', 'params', 'metadata', 'entry',
  'unjournaled',
}

-- What pv_op_finish reads of a record: a hot path, so not the whole record. 'id' comes first
-- (op_load tells a missing record by it).
local FINISH_FIELDS = {
  'id', 'kind', 'target', 'status', 'progress', 'message', 'worker', 'holds', 'token', 'entry',
  'target_unlocked',
}

-- What the other fenced writes (renew, journal) and a lock check read.
local FENCE_FIELDS = {'id', 'kind', 'status', 'token', 'entry', 'cancel_requested'}

-- The record at key as a table of strings (the given fields, or all), or nil when there is none.
local function op_load(key, fields)
  fields = fields or OP_FIELDS
  local vals = redis.call('HMGET', key, unpack(fields))
  if not vals[1] then return nil end
  local rec, stored = {}, 0
  for i, f in ipairs(fields) do
    rec[f] = vals[i] or OP_DEFAULTS[f]
    if vals[i] then stored = stored + 1 end
  end
  return rec, stored
end

-- The record as a flat field/value array for a reply.
local function op_flat(rec)
  local out, n = {}, 0
  for _, f in ipairs(REPLY_FIELDS) do
    local v = rec[f]
    if v ~= nil then
      out[n + 1] = f
      out[n + 2] = v
      n = n + 2
    end
  end
  return out
end

-- Merges changes into rec and writes them, with updated_ms = now.
local function op_set(key, rec, changes, now)
  changes.updated_ms = now
  local argv = {}
  for f, v in pairs(changes) do
    rec[f] = tostring(v)
    argv[#argv + 1] = f
    argv[#argv + 1] = rec[f]
  end
  redis.call('HSET', key, unpack(argv))
end

-- The resources an operation holds: its target (unless minted for it: target_unlocked), then its
-- holds, without repeats.
local function op_resources(rec)
  local out = {}
  if rec.target and rec.target ~= '' and rec.target_unlocked ~= '1' then out[1] = rec.target end
  -- Most operations hold nothing but their target: no JSON decoding for them.
  if rec.holds == nil or rec.holds == '[]' or rec.holds == '' then return out end
  local seen = {}
  if out[1] then seen[out[1]] = true end
  local ok, holds = pcall(cjson.decode, rec.holds)
  if ok and type(holds) == 'table' then
    for _, h in ipairs(holds) do
      local res = tostring(h)
      if res ~= '' and not seen[res] then
        seen[res] = true
        out[#out + 1] = res
      end
    end
  end
  return out
end

-- nil when KEYS[from..] declare every lock key of rec, else the need_locks reply.
local function need_locks(keys, from, base, rec)
  local declared = {}
  for i = from, #keys do declared[keys[i]] = true end
  for _, res in ipairs(op_resources(rec)) do
    if not declared[base .. 'lock:' .. res] then
      return {'need_locks', rec.target or '', rec.holds or '[]'}
    end
  end
  return nil
end

-- Frees the locks of rec that still name it (a lock never names anyone else while rec is
-- unfinished, but a stale lock may have been taken over since).
local function locks_release(base, rec)
  for _, res in ipairs(op_resources(rec)) do
    local key = base .. 'lock:' .. res
    if redis.call('GET', key) == rec.id then redis.call('DEL', key) end
  end
end

-- One entry of the operators' events stream: flat fields, empty strings rather than missing.
local function op_event(key, maxlen, rec, message)
  redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'op', rec.id, 'kind', rec.kind or '',
    'target', rec.target or '', 'status', rec.status or '', 'progress', rec.progress or '0',
    'message', message or '', 'worker', rec.worker or '')
end

-- Wakes the waiters and watchers of rec (WaitOperation, WatchOperation).
local function op_publish(base, rec)
  redis.call('PUBLISH', base .. 'chan:' .. rec.id, rec.status)
end

-- The indexes ListOperations reads when it filters (shared/pv_op.h): like the index of every
-- operation, sorted sets of ids scored by created ms, one per kind and one per target, so a
-- filtered page is O(log n + page) instead of a walk over everything. They are built from the
-- base and the record, in the same slot as the record.
local function kind_index(base, kind) return base .. 'by-kind:' .. kind end
local function target_index(base, target) return base .. 'by-target:' .. target end

-- Members of an index checked per write: an index gains one member per submit, so removing up
-- to four expired ones per submit keeps it to the retained records (and drains what an older
-- version left) at a bounded cost per call. The checks are batched: one submit in
-- INDEX_TRIM_EVERY (by its id's last byte) checks INDEX_TRIM * INDEX_TRIM_EVERY members of each
-- index, the same pace at three reads per INDEX_TRIM_EVERY submits instead of three per submit.
local INDEX_TRIM = 4
local INDEX_TRIM_EVERY = 4

-- Drops from index the members whose record expired, among its INDEX_TRIM oldest that are
-- older than the retention (a record expires retention after it ends, so no younger one can
-- have; an old one still running stays).
local function index_trim(base, index, now, retention)
  if not retention or retention <= 0 then return end
  local old = redis.call('ZRANGEBYSCORE', index, '-inf', '(' .. (now - retention * 1000),
    'LIMIT', 0, INDEX_TRIM * INDEX_TRIM_EVERY)
  for _, id in ipairs(old) do
    if redis.call('EXISTS', base .. 'op:' .. id) == 0 then redis.call('ZREM', index, id) end
  end
end

-- The error text of a fenced write that must not happen, or nil when the token is current and
-- the record RUNNING.
local function fence(rec, id, token)
  if not rec then return 'NOT_FOUND operation ' .. id .. ' not found' end
  if rec.token ~= token then
    return 'ABORTED lease lost: operation ' .. id .. ' is now leased with a newer token'
  end
  if DONE[rec.status] then
    return 'FAILED_PRECONDITION operation ' .. id .. ' is already ' .. rec.status
  end
  if rec.status ~= 'RUNNING' then
    return 'ABORTED lease lost: operation ' .. id .. ' was handed back (' .. rec.status .. ')'
  end
  return nil
end

-- Whether rec was handed over to another queue (pv_op_handover): such an operation is not
-- ended by a cancel where it stands; a worker runs it to finish or undo what was started.
local function handed_over(rec)
  return rec.handed ~= nil and rec.handed ~= ''
end

-- Ends rec for good: final status and error, no lease; frees its locks, acks its stream entry
-- (c.queue, c.entry may be nil), starts its retention, tells watchers and operators.
-- c = {base, key, queue, entry, events, maxlen, retention}
local function op_end(c, rec, status, code, errmsg, now)
  local changes = {status = status, finished_ms = now, lease_until_ms = 0, retry_at_ms = 0}
  if status == 'SUCCEEDED' then
    changes.progress = 100
    changes.error_code = 0
    changes.error_message = ''
    -- a success may say its last word itself (what a progress call just before it would)
    if (errmsg or '') ~= '' then
      changes.message = errmsg
    elseif (rec.message or '') == '' then
      changes.message = 'succeeded'
    end
  else
    changes.error_code = code
    changes.error_message = errmsg
    changes.message = errmsg
  end
  op_set(c.key, rec, changes, now)
  locks_release(c.base, rec)
  if c.queue and c.entry and c.entry ~= '' then redis.call('XACK', c.queue, GROUP, c.entry) end
  redis.call('EXPIRE', c.key, c.retention)
  -- A target has one unfinished operation at most (its lock), so the one ending now is its
  -- newest: the target's index lives as long as that record, and a target never used again
  -- leaves nothing behind.
  if rec.target and rec.target ~= '' then
    redis.call('EXPIRE', target_index(c.base, rec.target), c.retention)
  end
  -- The output stream (pv_op_output) lives as long as its record. A stream ends with an 'end'
  -- entry, so that whoever follows it (a relay blocked in XREAD) wakes at the end too;
  -- operations without output get no stream and cost nothing.
  local out = c.base .. 'out:' .. rec.id
  if c.output then -- the run's last output entry, told with its end (pv_op_finish)
    local xadd = {'XADD', out, 'MAXLEN', '~', c.output_maxlen, '*'}
    for i = 1, #c.output do xadd[#xadd + 1] = c.output[i] end
    redis.call(unpack(xadd))
  end
  if redis.call('XADD', out, 'NOMKSTREAM', '*', 'type', 'end', 'status', status) then
    redis.call('EXPIRE', out, c.retention)
  end
  op_publish(c.base, rec)
  op_event(c.events, c.maxlen, rec, status == 'SUCCEEDED' and rec.message or errmsg)
end

-- Ends rec FAILED with its last transient error and copies it to the dead-letter stream.
local function op_dead(c, dead_key, rec, now)
  local code = tonumber(rec.last_error_code or '0') or 0
  local msg = rec.last_error_message or ''
  if code == 0 then
    code = 14 -- UNAVAILABLE: every delivery was lost with its worker, none reported an error
    msg = 'delivered ' .. rec.attempts .. ' times and never finished: its workers were lost'
  end
  redis.call('XADD', dead_key, '*', 'op', rec.id, 'kind', rec.kind or '', 'target',
    rec.target or '', 'attempts', rec.attempts, 'code', code, 'message', msg)
  op_end(c, rec, 'FAILED', code, msg, now)
end

local function sid_parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms) or 0, tonumber(seq) or 0
end

-- Stream id order.
local function sid_less(a, b)
  local ams, aseq = sid_parts(a)
  local bms, bseq = sid_parts(b)
  if ams ~= bms then return ams < bms end
  return aseq < bseq
end

-- The smallest id after id.
local function sid_next(id)
  local ms, seq = sid_parts(id)
  return string.format('%.0f-%.0f', ms, seq + 1)
end

local function flat_to_table(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

-- pv_op_submit: a new operation, atomically: record, queue entry, locks, idempotency key, index,
-- event, publish.
--   KEYS[1] record, [2] queue stream, [3] index, [4] events, [5..4+n] lock keys (target and
--   holds), [5+n] idempotency key (only with a request id)
--   ARGV[1] base, [2] id, [3] kind, [4] target, [5] queue, [6] params JSON, [7] metadata JSON,
--   [8] request id ('' = none), [9] max attempts, [10] holds JSON array, [11] events maxlen,
--   [12] n, [13] idempotency seconds, [14] client ('' = not counted), [15] the client's limit
--   of unfinished operations (0 = none), [16] the name of that limit for the error message,
--   [17] '1' = notify_end: open the output stream now (a plumbing entry type=open), so that
--   op_end, which ends only an existing stream, writes the end entry a waiter blocks on
--   [18] retention seconds (finished records live this long: index members older than it whose
--   record is gone are trimmed; absent or 0: no trimming)
--   [19] '1' = the target was minted for this operation: no lock on it (none among KEYS; the
--   record's target_unlocked tells op_resources)
--   Besides KEYS[3], the operation joins the index of its kind and of its target (kind_index,
--   target_index).
--   With a client, its set of unfinished operations is the key after the idempotency key (or
--   after the locks without a request id).
--   returns {'created', record}, or {'existed', record} for a request id seen before
--   errors: ABORTED <resource> is held by operation <id> (<kind>); ALREADY_EXISTS;
--   RESOURCE_EXHAUSTED when the client has its limit of unfinished operations already
redis.register_function('pv_op_submit', function(keys, args)
  local base, id, rid = args[1], args[2], args[8]
  local nlocks = tonumber(args[12]) or 0
  local idem = nil
  local nextkey = 5 + nlocks
  if rid ~= '' then
    idem = keys[nextkey]
    nextkey = nextkey + 1
  end
  if idem then
    local existing = redis.call('GET', idem)
    local rec = existing and op_load(base .. 'op:' .. existing)
    if rec then return {'existed', op_flat(rec)} end
  end
  local client, climit = args[14] or '', tonumber(args[15] or '0') or 0
  local ckey = nil
  if client ~= '' then ckey = keys[nextkey] end
  if ckey and climit > 0 and redis.call('SCARD', ckey) >= climit then
    -- Members are only added here; they are dropped lazily, when the set is full, for the
    -- operations that finished or expired since. This costs O(limit) only at the limit and
    -- needs no bookkeeping in every path that ends an operation.
    for _, oid in ipairs(redis.call('SMEMBERS', ckey)) do
      local st = redis.call('HGET', base .. 'op:' .. oid, 'status')
      if not st or DONE[st] then redis.call('SREM', ckey, oid) end
    end
    local n = redis.call('SCARD', ckey)
    if n >= climit then
      return redis.error_reply('RESOURCE_EXHAUSTED client ' .. client .. ' has ' .. n ..
        ' unfinished operations, the limit (' .. (args[16] or 'limit') .. ') is ' .. climit ..
        ': wait for some to end')
    end
  end
  local lock_prefix = base .. 'lock:'
  for i = 5, 4 + nlocks do
    local holder = redis.call('GET', keys[i])
    if holder and holder ~= id then
      local h = op_load(base .. 'op:' .. holder, FENCE_FIELDS)
      -- A lock whose holder is finished or gone is stale: it is simply taken over below.
      if h and not DONE[h.status] then
        return redis.error_reply('ABORTED ' .. string.sub(keys[i], #lock_prefix + 1) ..
          ' is held by operation ' .. holder .. ' (' .. (h.kind or '') .. ')')
      end
    end
  end
  if redis.call('EXISTS', keys[1]) == 1 then
    return redis.error_reply('ALREADY_EXISTS operation ' .. id .. ' exists already')
  end
  local now = tostring(now_ms())
  local entry = redis.call('XADD', keys[2], '*', 'op', id, 'kind', args[3])
  -- Only what differs from OP_DEFAULTS is stored (and returned).
  local flat = {'id', id, 'kind', args[3], 'target', args[4], 'queue', args[5],
    'status', 'PENDING', 'created_ms', now, 'updated_ms', now, 'max_attempts', args[9],
    'params', args[6], 'metadata', args[7], 'entry', entry}
  if rid ~= '' then
    flat[#flat + 1] = 'request_id'
    flat[#flat + 1] = rid
  end
  if args[10] ~= '[]' and args[10] ~= '' then
    flat[#flat + 1] = 'holds'
    flat[#flat + 1] = args[10]
  end
  if args[19] == '1' then
    flat[#flat + 1] = 'target_unlocked'
    flat[#flat + 1] = '1'
  end
  redis.call('HSET', keys[1], unpack(flat))
  for i = 5, 4 + nlocks do redis.call('SET', keys[i], id) end
  if idem then redis.call('SET', idem, id, 'EX', args[13]) end
  redis.call('ZADD', keys[3], now, id)
  local kidx = kind_index(base, args[3])
  redis.call('ZADD', kidx, now, id)
  local tidx = nil
  -- a target minted for this operation has a fresh index of its own: nothing to persist or trim
  local minted = args[19] == '1'
  if args[4] ~= '' then
    tidx = target_index(base, args[4])
    redis.call('ZADD', tidx, now, id)
    -- unfinished: kept until it ends (op_end sets the expiry again)
    if not minted then redis.call('PERSIST', tidx) end
  end
  local retention = tonumber(args[18] or '0') or 0
  local nowms = tonumber(now)
  if string.byte(id, -1) % INDEX_TRIM_EVERY == 0 then
    index_trim(base, keys[3], nowms, retention)
    index_trim(base, kidx, nowms, retention)
    if tidx and not minted then index_trim(base, tidx, nowms, retention) end
  end
  if args[17] == '1' then
    local out = base .. 'out:' .. id
    redis.call('XADD', out, '*', 'type', 'open', 'status', 'PENDING')
    -- op_end sets the retention; until then it lives as long as the idempotency key
    redis.call('EXPIRE', out, args[13])
  end
  if ckey then
    redis.call('SADD', ckey, id)
    -- A client that went away leaves no set behind for longer than its records live.
    redis.call('EXPIRE', ckey, args[13])
  end
  op_event(keys[4], args[11], {id = id, kind = args[3], target = args[4], status = 'PENDING'},
    'submitted to queue ' .. args[5])
  -- No publish: nobody can be waiting on the channel of an id minted by this very call.
  return {'created', flat}
end)

-- pv_op_acquire: decides what a worker does with a delivered stream entry and, to run it, leases
-- the operation with a new fencing token and counts the delivery.
--   KEYS[1] record, [2] queue stream, [3] events, [4] dead-letter stream, [5] fence counter,
--   [6..] lock keys (needed only to end it here: see need_locks)
--   ARGV[1] base, [2] id, [3] entry, [4] consumer, [5] lease ms, [6] events maxlen,
--   [7] retention seconds
--   returns {decision, token, record}: decision RUN | DONE | CANCELLED | DEAD | BUSY | GONE;
--   token '0' unless RUN; record {} for GONE; or need_locks
local function acquire_entry(keys, base, id, entry, consumer, lease_ms, maxlen, retention)
  local rec, stored = op_load(keys[1])
  if not rec then
    redis.call('XACK', keys[2], GROUP, entry)
    return {'GONE', '0', {}}
  end
  -- Entry ids are per stream: a late entry of the queue it was handed over to (pv_op_handover)
  -- or back from can read the same as the one it rides on now, made in the same millisecond.
  if DONE[rec.status] or rec.entry ~= entry or keys[2] ~= base .. 'q:' .. (rec.queue or '') then
    -- Finished, or a late duplicate of an entry the record no longer rides on.
    redis.call('XACK', keys[2], GROUP, entry)
    if rec.status == 'CANCELLED' then return {'CANCELLED', '0', op_flat(rec)} end
    return {'DONE', '0', op_flat(rec)}
  end
  local now = now_ms()
  if rec.status == 'RUNNING' and tonumber(rec.lease_until_ms) > now and rec.worker ~= consumer then
    return {'BUSY', '0', op_flat(rec)}
  end
  local c = {base = base, key = keys[1], queue = keys[2], entry = entry, events = keys[3],
             maxlen = maxlen, retention = retention}
  local attempts = tonumber(rec.attempts)
  -- A handed-over operation runs even when cancelled: its handler finishes or undoes what its
  -- first queue's worker started (a deploy's reservation).
  if rec.cancel_requested == '1' and not handed_over(rec) then
    local nl = need_locks(keys, 6, base, rec)
    if nl then return nl end
    local why = 'cancelled before it ran'
    if rec.started_ms ~= '0' then why = 'cancelled' end
    op_end(c, rec, 'CANCELLED', 1, why, now)
    return {'CANCELLED', '0', op_flat(rec)}
  end
  if attempts >= tonumber(rec.max_attempts) then
    local nl = need_locks(keys, 6, base, rec)
    if nl then return nl end
    op_dead(c, keys[4], rec, now)
    return {'DEAD', '0', op_flat(rec)}
  end
  -- taken where it was handed over: its hand-over's timeout (pv_op_handover) is moot
  if handed_over(rec) and rec.handed == entry then redis.call('ZREM', base .. 'delayed', id) end
  local token = tostring(redis.call('INCR', keys[5]))
  local changes = {status = 'RUNNING', token = token, worker = consumer, attempts = attempts + 1,
                   lease_until_ms = now + tonumber(lease_ms)}
  if rec.started_ms == '0' then changes.started_ms = now end
  -- Every field of the hash is one of OP_FIELDS or a journal entry: when the stored ones are
  -- all of it, no delivery has journaled a step yet, and the worker can skip reading the journal
  -- (a reply-only field: the record never stores it; absent means "ask").
  local unjournaled = redis.call('HLEN', keys[1]) == stored
  op_set(keys[1], rec, changes, now)
  if unjournaled then rec.unjournaled = '1' end
  op_publish(base, rec)
  op_event(keys[3], maxlen, rec,
    'started by ' .. consumer .. ' (attempt ' .. rec.attempts .. ' of ' .. rec.max_attempts .. ')')
  return {'RUN', token, op_flat(rec)}
end

redis.register_function('pv_op_acquire', function(keys, args)
  return acquire_entry(keys, args[1], args[2], args[3], args[4], args[5], args[6], args[7])
end)

-- pv_op_take: a worker with free slots and a backlog reads its next entries and leases them in
-- one call, instead of a read and then the acquisitions: XREADGROUP COUNT n (never blocking),
-- then for each entry what pv_op_acquire does. An entry without an operation id is acked.
--   KEYS[1] queue stream, [2] events, [3] dead-letter stream, [4] fence counter
--   ARGV[1] base, [2] consumer, [3] count, [4] lease ms, [5] events maxlen, [6] retention seconds
--   returns one {entry, op id, reply of pv_op_acquire} per entry read (op id '' and reply {}
--   for an entry that carried none); a reply may be need_locks: the record's keys are reached
--   through the entries, so its lock keys cannot be declared; the caller acquires that one alone
redis.register_function('pv_op_take', function(keys, args)
  local base, consumer = args[1], args[2]
  local read = redis.call('XREADGROUP', 'GROUP', GROUP, consumer, 'COUNT', tonumber(args[3]),
    'STREAMS', keys[1], '>')
  local out = {}
  if not read or not read[1] then return out end
  for _, e in ipairs(read[1][2]) do
    local entry, id = e[1], flat_to_table(e[2]).op
    if not id or id == '' then
      redis.call('XACK', keys[1], GROUP, entry)
      out[#out + 1] = {entry, '', {}}
    else
      local k = {base .. 'op:' .. id, keys[1], keys[2], keys[3], keys[4]}
      out[#out + 1] = {entry, id,
        acquire_entry(k, base, id, entry, consumer, args[4], args[5], args[6])}
    end
  end
  return out
end)

-- pv_op_renew: extends the lease and resets the idle time of the stream entry (XCLAIM JUSTID to
-- the same consumer), so XAUTOCLAIM leaves a live operation alone.
--   KEYS[1] record, [2] queue stream
--   ARGV[1] base, [2] id, [3] token, [4] consumer, [5] lease ms
--   returns 1 when a cancel was requested, else 0
redis.register_function('pv_op_renew', function(keys, args)
  local rec = op_load(keys[1], FENCE_FIELDS)
  local err = fence(rec, args[2], args[3])
  if err then return redis.error_reply(err) end
  redis.call('HSET', keys[1], 'lease_until_ms', now_ms() + tonumber(args[5]))
  if rec.entry ~= '' then
    redis.call('XCLAIM', keys[2], GROUP, args[4], 0, rec.entry, 'JUSTID')
  end
  if rec.cancel_requested == '1' then return 1 end
  return 0
end)

-- pv_op_progress: a fenced progress report.
--   KEYS[1] record, [2] events
--   ARGV[1] base, [2] id, [3] token, [4] percent 0..100, [5] message, [6] events maxlen
--   returns 'OK'
redis.register_function('pv_op_progress', function(keys, args)
  local rec = op_load(keys[1], FINISH_FIELDS)
  local err = fence(rec, args[2], args[3])
  if err then return redis.error_reply(err) end
  op_set(keys[1], rec, {progress = args[4], message = args[5]}, now_ms())
  op_publish(args[1], rec)
  op_event(keys[2], args[6], rec, args[5])
  return redis.status_reply('OK')
end)

-- pv_op_journal_put: a fenced journal entry: step <step> of the handler is done, with a value
-- (field "j:<step>" of the record).
--   KEYS[1] record
--   ARGV[1] base, [2] id, [3] token, [4] step, [5] value
--   returns 'OK'
redis.register_function('pv_op_journal_put', function(keys, args)
  local err = fence(op_load(keys[1], FENCE_FIELDS), args[2], args[3])
  if err then return redis.error_reply(err) end
  redis.call('HSET', keys[1], 'j:' .. args[4], args[5])
  return redis.status_reply('OK')
end)

-- pv_op_output: a fenced entry on the operation's output stream, what a streaming call relays to
-- its client as it happens (one message per workload created, log lines, ...).
--   KEYS[1] record, [2] output stream (<base>out:<id>)
--   ARGV[1] base, [2] id, [3] token, [4] approximate maxlen, [5..] field, value, ...
--   returns the entry id
redis.register_function('pv_op_output', function(keys, args)
  local err = fence(op_load(keys[1], FENCE_FIELDS), args[2], args[3])
  if err then return redis.error_reply(err) end
  local xadd = {'XADD', keys[2], 'MAXLEN', '~', args[4], '*'}
  for i = 5, #args do xadd[#xadd + 1] = args[i] end
  return redis.call(unpack(xadd))
end)

-- pv_op_output_journal: pv_op_output and journal entries in one fenced call: a step's answer
-- and the mark that its output was written (a redelivery must not tell the client twice) are
-- saved with the output itself, atomically, instead of a journal call before and after it.
--   KEYS[1] record, [2] output stream (<base>out:<id>)
--   ARGV[1] base, [2] id, [3] token, [4] approximate maxlen, [5] number of journal entries m,
--   [6..5+2m] step, value, ..., then field, value, ... of the output entry
--   returns the entry id
redis.register_function('pv_op_output_journal', function(keys, args)
  local err = fence(op_load(keys[1], FENCE_FIELDS), args[2], args[3])
  if err then return redis.error_reply(err) end
  local m = tonumber(args[5]) or 0
  local hset = {'HSET', keys[1]}
  for i = 6, 5 + 2 * m, 2 do
    hset[#hset + 1] = 'j:' .. args[i]
    hset[#hset + 1] = args[i + 1]
  end
  local xadd = {'XADD', keys[2], 'MAXLEN', '~', args[4], '*'}
  for i = 6 + 2 * m, #args do xadd[#xadd + 1] = args[i] end
  local id = redis.call(unpack(xadd))
  if m > 0 then redis.call(unpack(hset)) end
  return id
end)

-- pv_op_finish: the fenced end of a run: SUCCEEDED, FAILED or CANCELLED. Finishing again with the
-- same token and status (a retried call whose first answer was lost) returns the record as is.
--   KEYS[1] record, [2] queue stream, [3] events, [4..] lock keys
--   ARGV[1] base, [2] id, [3] token, [4] status, [5] error code, [6] error message (for
--   SUCCEEDED: the record's last message, '' = keep the last progress message or 'succeeded'),
--   [7] events maxlen, [8] retention seconds, [9] output maxlen, [10..] field, value, ... of
--   an output entry written just before the end entry (the run's last word, told with its end:
--   a call less; none: no entry)
--   returns {'OK'} (the worker has the record already), or need_locks
redis.register_function('pv_op_finish', function(keys, args)
  local base, id, token, status = args[1], args[2], args[3], args[4]
  local rec = op_load(keys[1], FINISH_FIELDS)
  if rec and rec.token == token and rec.status == status then return {'OK'} end
  local err = fence(rec, id, token)
  if err then return redis.error_reply(err) end
  local nl = need_locks(keys, 4, base, rec)
  if nl then return nl end
  local c = {base = base, key = keys[1], queue = keys[2], entry = rec.entry, events = keys[3],
             maxlen = args[7], retention = args[8]}
  if #args > 9 then
    c.output = {unpack(args, 10)}
    c.output_maxlen = args[9]
  end
  op_end(c, rec, status, tonumber(args[5]), args[6], now_ms())
  return {'OK'}
end)

-- pv_op_retry_later: a fenced transient failure. The entry is acked and the operation waits in
-- the delayed set, PENDING, until pv_op_promote_due queues it again; on its last allowed
-- delivery it fails for good (dead letter) instead, and a requested cancel ends it CANCELLED.
--   KEYS[1] record, [2] queue stream, [3] delayed zset, [4] events, [5] dead-letter stream,
--   [6..] lock keys
--   ARGV[1] base, [2] id, [3] token, [4] delay ms, [5] error code, [6] error message,
--   [7] events maxlen, [8] retention seconds
--   returns {'RETRY' | 'DEAD' | 'CANCELLED', record}, or need_locks
redis.register_function('pv_op_retry_later', function(keys, args)
  local base, id = args[1], args[2]
  local rec = op_load(keys[1])
  local err = fence(rec, id, args[3])
  if err then return redis.error_reply(err) end
  local now = now_ms()
  local c = {base = base, key = keys[1], queue = keys[2], entry = rec.entry, events = keys[4],
             maxlen = args[7], retention = args[8]}
  local code, msg = tonumber(args[5]), args[6]
  local last = {last_error_code = code, last_error_message = msg}
  local cancelled = rec.cancel_requested == '1' and not handed_over(rec)
  if cancelled or tonumber(rec.attempts) >= tonumber(rec.max_attempts) then
    local nl = need_locks(keys, 6, base, rec)
    if nl then return nl end
    op_set(keys[1], rec, last, now)
    if cancelled then
      op_end(c, rec, 'CANCELLED', 1, 'cancelled', now)
      return {'CANCELLED', op_flat(rec)}
    end
    op_dead(c, keys[5], rec, now)
    return {'DEAD', op_flat(rec)}
  end
  local due = now + tonumber(args[4])
  if rec.entry ~= '' then redis.call('XACK', keys[2], GROUP, rec.entry) end
  last.status = 'PENDING'
  last.entry = ''
  last.lease_until_ms = 0
  last.retry_at_ms = due
  last.message = 'attempt ' .. rec.attempts .. ' of ' .. rec.max_attempts .. ' failed: ' .. msg ..
    '; retrying in ' .. args[4] .. ' ms'
  op_set(keys[1], rec, last, now)
  redis.call('ZADD', keys[3], due, id)
  op_publish(base, rec)
  op_event(keys[4], args[7], rec, rec.message)
  return {'RETRY', op_flat(rec)}
end)

-- A running operation's delivery given back uncounted (pv_op_release, pv_op_handover): its entry
-- on the stream `from` acked, a fresh one on `to`; -> that entry and the attempts it keeps (the
-- lease had counted this delivery).
local function requeue(rec, from, to)
  if rec.entry ~= '' then redis.call('XACK', from, GROUP, rec.entry) end
  local entry = redis.call('XADD', to, '*', 'op', rec.id, 'kind', rec.kind)
  local attempts = tonumber(rec.attempts) - 1
  return entry, attempts < 0 and 0 or attempts
end

-- pv_op_release: a fenced hand-back (worker shutdown): PENDING again on a fresh entry of its
-- queue, the old entry acked; the delivery does not count against max_attempts.
--   KEYS[1] record, [2] queue stream, [3] events
--   ARGV[1] base, [2] id, [3] token, [4] events maxlen
--   returns {'OK', record}
redis.register_function('pv_op_release', function(keys, args)
  local base, id = args[1], args[2]
  local rec = op_load(keys[1])
  local err = fence(rec, id, args[3])
  if err then return redis.error_reply(err) end
  local entry, attempts = requeue(rec, keys[2], keys[2])
  op_set(keys[1], rec, {status = 'PENDING', entry = entry, lease_until_ms = 0,
                        attempts = attempts}, now_ms())
  op_publish(base, rec)
  op_event(keys[3], args[4], rec, 'handed back by ' .. (rec.worker or ''))
  return {'OK', op_flat(rec)}
end)

-- What pv_op_handover reads of a record: what a fenced write and its event need, and the count.
local HANDOVER_FIELDS = {'id', 'kind', 'target', 'status', 'progress', 'worker', 'token', 'entry',
  'attempts'}

-- pv_op_handover: a fenced hand-over of a running operation to another queue, whose workers
-- carry it on (a deploy whose plan put every instance on one node goes on on that node's agent,
-- one operation instead of a deploy and its node's part): PENDING on a fresh entry of the new
-- queue with new params, the old entry acked, the output entry that announces it written, all
-- at once. The delivery does not count against max_attempts (as pv_op_release). The record keeps
-- the new entry in 'handed': while it is still PENDING on that entry when the timeout is due
-- (pv_op_promote_due finds it in the delayed set), no worker of the new queue took it, and it
-- goes back to the ops queue with a cancel, for the ops workers to undo it (a worker that takes
-- it takes it out of the delayed set).
--   KEYS[1] record, [2] old queue stream, [3] new queue stream, [4] events, [5] output stream,
--   [6] delayed zset
--   ARGV[1] base, [2] id, [3] token, [4] new queue name, [5] params JSON, [6] events maxlen,
--   [7] output maxlen, [8] timeout ms, [9..] field, value, ... of the output entry (none: no
--   entry)
--   returns 'OK'
local function handover(keys, args, rec, by, output_from)
  local base, id = args[1], args[2]
  local entry, attempts = requeue(rec, keys[2], keys[3])
  local now = now_ms()
  op_set(keys[1], rec, {status = 'PENDING', queue = args[4], params = args[5], entry = entry,
                        handed = entry, lease_until_ms = 0, attempts = attempts}, now)
  redis.call('ZADD', keys[6], now + tonumber(args[8]), id)
  if #args >= output_from then
    local xadd = {'XADD', keys[5], 'MAXLEN', '~', args[7], '*'}
    for i = output_from, #args do xadd[#xadd + 1] = args[i] end
    redis.call(unpack(xadd))
  end
  op_publish(base, rec)
  op_event(keys[4], args[6], rec, 'handed over to queue ' .. args[4] .. ' by ' .. by)
  return redis.status_reply('OK')
end

redis.register_function('pv_op_handover', function(keys, args)
  local rec = op_load(keys[1], HANDOVER_FIELDS)
  local err = fence(rec, args[2], args[3])
  if err then return redis.error_reply(err) end
  return handover(keys, args, rec, rec.worker, 9)
end)

-- pv_op_handover_pending: pv_op_handover of an operation nobody leased yet, still PENDING, never
-- run, on the ops queue entry its caller was delivered and has not acknowledged: a one-node
-- deploy whose plan the ops worker asked for without a lease goes to its node's agent with no
-- RUNNING in between (a lease, a fencing token, an event and a publish less). The delivery
-- stands in for the lease: the consumer group gives an entry to one worker at a time, and
-- another that claims it later (its worker stalled) finds the record moved on.
--   KEYS as pv_op_handover's; ARGV as its, but [3] is the entry instead of a token and [9] names
--   the caller (for the event); the output entry's fields from [10]
--   returns 'OK', or 'MOVED' (nothing written) when the record is not that any more: gone,
--   cancelled, run or handed over since, or on another entry or queue
redis.register_function('pv_op_handover_pending', function(keys, args)
  local rec = op_load(keys[1])
  if not rec or rec.status ~= 'PENDING' or rec.entry ~= args[3] or rec.attempts ~= '0' or
      rec.started_ms ~= '0' or rec.cancel_requested == '1' or rec.handed ~= '' or
      keys[2] ~= args[1] .. 'q:' .. (rec.queue or '') then
    return 'MOVED'
  end
  return handover(keys, args, rec, args[9], 10)
end)

-- A handed-over operation (pv_op_handover) that is still PENDING on its new queue goes back to
-- the ops queue with a cancel requested, for the ops workers to undo it (a deploy gives its
-- reservation back): a cancel before it ran, or no worker of the new queue took it in time.
local function handed_back(base, key, rec, events, maxlen, why, now)
  local entry = redis.call('XADD', base .. 'q:ops', '*', 'op', rec.id, 'kind', rec.kind)
  op_set(key, rec, {queue = 'ops', entry = entry, cancel_requested = 1, message = why}, now)
  op_publish(base, rec)
  op_event(events, maxlen, rec, why)
end

-- pv_op_cancel: PENDING ends CANCELLED at once (out of the delayed set; a worker that receives
-- its entry acks it); RUNNING gets cancel_requested for its worker; finished: unchanged.
--   KEYS[1] record, [2] delayed zset, [3] events, [4..] lock keys
--   ARGV[1] base, [2] id, [3] events maxlen, [4] retention seconds
--   returns {'OK', record}, or need_locks
redis.register_function('pv_op_cancel', function(keys, args)
  local base, id = args[1], args[2]
  local rec = op_load(keys[1])
  if not rec then return redis.error_reply('NOT_FOUND operation ' .. id .. ' not found') end
  if DONE[rec.status] then return {'OK', op_flat(rec)} end
  local now = now_ms()
  if rec.status == 'PENDING' and handed_over(rec) then
    -- wherever it waits (its agent may never come back), the ops workers undo it
    if rec.queue ~= 'ops' then
      handed_back(base, keys[1], rec, keys[3], args[3], 'cancel requested while it waited on ' ..
        rec.queue .. ': handed back to the ops queue to be undone', now)
    end
    return {'OK', op_flat(rec)}
  end
  if rec.status == 'PENDING' then
    local nl = need_locks(keys, 4, base, rec)
    if nl then return nl end
    rec.cancel_requested = '1'
    redis.call('HSET', keys[1], 'cancel_requested', '1')
    redis.call('ZREM', keys[2], id)
    local c = {base = base, key = keys[1], events = keys[3], maxlen = args[3],
               retention = args[4]}
    op_end(c, rec, 'CANCELLED', 1, 'cancelled before it ran', now)
    return {'OK', op_flat(rec)}
  end
  if rec.cancel_requested ~= '1' then
    op_set(keys[1], rec, {cancel_requested = 1}, now)
    op_publish(base, rec)
    op_event(keys[3], args[3], rec, 'cancel requested')
  end
  return {'OK', op_flat(rec)}
end)

-- pv_op_promote_due: puts the retries whose backoff is over back on their queues (a new entry
-- each), at most ARGV[2] of them per call.
--   KEYS[1] delayed zset, [2] events
--   ARGV[1] base, [2] limit, [3] events maxlen
--   returns how many were queued again
redis.register_function('pv_op_promote_due', function(keys, args)
  local base = args[1]
  local now = now_ms()
  local due = redis.call('ZRANGEBYSCORE', keys[1], '-inf', now, 'LIMIT', 0, tonumber(args[2]))
  local moved = 0
  for _, id in ipairs(due) do
    redis.call('ZREM', keys[1], id)
    local key = base .. 'op:' .. id
    local rec = op_load(key)
    if rec and rec.status == 'PENDING' and rec.entry == '' then
      local entry = redis.call('XADD', base .. 'q:' .. rec.queue, '*', 'op', id, 'kind', rec.kind)
      op_set(key, rec, {entry = entry, retry_at_ms = 0}, now)
      op_publish(base, rec)
      op_event(keys[2], args[3], rec, 'queued again on ' .. rec.queue .. ' after its backoff')
      moved = moved + 1
    elseif rec and rec.status == 'PENDING' and handed_over(rec) and rec.entry == rec.handed and
        rec.queue ~= 'ops' then
      -- the timeout of a hand-over (pv_op_handover): no worker of its queue took it
      handed_back(base, key, rec, keys[2], args[3], 'no worker of ' .. rec.queue ..
        ' took it in time: handed back to the ops queue to be undone', now)
      moved = moved + 1
    end
  end
  return moved
end)

-- pv_op_trim: trims a queue stream (XTRIM MINID, exact) below the oldest entry any group still
-- needs: its oldest pending entry or its first entry not yet delivered. Redis would drop pending
-- entries silently, so nothing at or above that bound is ever removed.
--   KEYS[1] queue stream
--   returns the number of entries removed
redis.register_function('pv_op_trim', function(keys, args)
  if redis.call('EXISTS', keys[1]) == 0 then return 0 end
  local groups = redis.call('XINFO', 'GROUPS', keys[1])
  if #groups == 0 then return 0 end -- nothing was ever delivered
  local keep = nil
  local function need(id)
    if not keep or sid_less(id, keep) then keep = id end
  end
  for _, g in ipairs(groups) do
    local info = flat_to_table(g)
    local delivered = info['last-delivered-id']
    local pending = redis.call('XPENDING', keys[1], info.name)
    if pending[1] > 0 then need(pending[2]) end
    local undelivered = redis.call('XRANGE', keys[1], '(' .. delivered, '+', 'COUNT', 1)
    if #undelivered > 0 then need(undelivered[1][1]) end
    if pending[1] == 0 and #undelivered == 0 then need(sid_next(delivered)) end
  end
  return redis.call('XTRIM', keys[1], 'MINID', keep)
end)

-- Keys matching base .. suffix .. '*' (the base is escaped: a prefix may hold glob characters).
local function scan_keys(base, suffix)
  local pattern = string.gsub(base .. suffix, '([%*%?%[%]\\])', '\\%1') .. '*'
  local out, cursor = {}, '0'
  repeat
    local r = redis.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = r[1]
    for _, k in ipairs(r[2]) do out[#out + 1] = k end
  until cursor == '0'
  table.sort(out)
  return out
end

-- Entry ids of a queue stream that are pending in its group, and its last delivered id.
local function queue_state(q)
  local pending, delivered = {}, nil
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', q)
  if not ok then return pending, delivered end
  for _, g in ipairs(groups) do
    local info = flat_to_table(g)
    if info.name == GROUP then
      delivered = info['last-delivered-id']
      if info.pending > 0 then
        for _, p in ipairs(redis.call('XPENDING', q, GROUP, '-', '+', info.pending)) do
          pending[p[1]] = true
        end
      end
    end
  end
  return pending, delivered
end

-- pv_op_check: consistency of the whole pipeline, read only. A problem is: an unfinished record
-- without its stream entry (or delayed retry), a RUNNING one whose entry is not pending or a
-- PENDING one whose entry was already delivered and acked (neither would ever be delivered
-- again), an unfinished record not holding its locks, a pending or undelivered entry without its
-- record, a lock naming a finished or missing operation.
--   KEYS[1] index, [2] delayed zset
--   ARGV[1] base
--   returns one line per problem
redis.register_function{function_name = 'pv_op_check', flags = {'no-writes'},
  callback = function(keys, args)
    local base = args[1]
    local problems = {}
    local function problem(s) problems[#problems + 1] = s end
    local streams = {}
    for _, q in ipairs(scan_keys(base, 'q:')) do
      if redis.call('TYPE', q).ok == 'stream' then
        local pending, delivered = queue_state(q)
        local present = {}
        for _, e in ipairs(redis.call('XRANGE', q, '-', '+')) do
          present[e[1]] = true
          if pending[e[1]] or not delivered or sid_less(delivered, e[1]) then
            local op = flat_to_table(e[2]).op or ''
            if redis.call('EXISTS', base .. 'op:' .. op) == 0 then
              problem('stream ' .. q .. ' entry ' .. e[1] .. ' carries operation ' .. op ..
                ', which has no record')
            end
          end
        end
        streams[q] = {present = present, pending = pending, delivered = delivered}
      end
    end
    for _, id in ipairs(redis.call('ZRANGE', keys[1], 0, -1)) do
      local rec = op_load(base .. 'op:' .. id)
      if rec and not DONE[rec.status] then
        local q = base .. 'q:' .. (rec.queue or '')
        local s = streams[q]
        local what = 'operation ' .. id .. ' (' .. rec.status .. ')'
        if (rec.entry or '') == '' then
          if not redis.call('ZSCORE', keys[2], id) then
            problem(what .. ' has neither a stream entry nor a delayed retry')
          end
        elseif not s or not s.present[rec.entry] then
          problem(what .. ' has no entry ' .. rec.entry .. ' in stream ' .. q)
        elseif rec.status == 'RUNNING' and not s.pending[rec.entry] then
          problem(what .. ' entry ' .. rec.entry .. ' is not pending in group ' .. GROUP ..
            ' of ' .. q .. ': it would never be redelivered')
        elseif rec.status == 'PENDING' and not s.pending[rec.entry] and s.delivered and
            not sid_less(s.delivered, rec.entry) then
          problem(what .. ' entry ' .. rec.entry .. ' of ' .. q ..
            ' was delivered and acked: it would never be delivered again')
        end
        for _, res in ipairs(op_resources(rec)) do
          local holder = redis.call('GET', base .. 'lock:' .. res)
          if holder ~= id then
            problem(what .. ' does not hold the lock of ' .. res .. ' (held by ' ..
              (holder or 'nobody') .. ')')
          end
        end
      end
    end
    local lock_prefix = base .. 'lock:'
    for _, lk in ipairs(scan_keys(base, 'lock:')) do
      local holder = redis.call('GET', lk)
      local res = string.sub(lk, #lock_prefix + 1)
      local rec = holder and op_load(base .. 'op:' .. holder)
      if not rec then
        problem('lock of ' .. res .. ' names operation ' .. tostring(holder) ..
          ', which has no record')
      elseif DONE[rec.status] then
        problem('lock of ' .. res .. ' names operation ' .. holder .. ', which is already ' ..
          rec.status)
      end
    end
    return problems
  end}

-- pv_test_effect(KEYS[1]=effect counter, KEYS[2]=per-operation marker, KEYS[3]=run counter,
-- ARGV[1]=operation id, ARGV[2]=marker ttl seconds): the side effect of the test.sleep kind,
-- applied at most once per operation: the marker is checked and set with the increment, as a
-- real idempotent side effect must be. The run counter counts every attempt, so tests can see
-- how often redelivery reached the effect. Returns the counter, or 0 when already applied.
redis.register_function('pv_test_effect', function(keys, args)
  redis.call('INCR', keys[3])
  if redis.call('SET', keys[2], args[1], 'NX', 'EX', tonumber(args[2])) then
    return redis.call('INCR', keys[1])
  end
  return 0
end)
