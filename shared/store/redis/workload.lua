#!lua name=pivirt_workload
--[[
  Workload records and their statuses (shared/store/pv_workload.h has the keys and fields). Loaded by
  every pivirt process on (re)connect, like the other libraries. Errors are
  redis.error_reply('<CODE> <message>').

  Conventions (those of the registry, registry.lua):
  - ARGV[1] is the key base "<prefix>{reg}:"; every key starts with it (one hash slot).
  - KEYS[1], when given, is the registry's node name index (<base>nodes).
  - Records are returned as flat field/value arrays (HGETALL).
  - The C side validates ids, names and JSON shapes; these functions check what only Redis can
    know (existence, uniqueness) and keep the record, its indexes and its status together.
  - A status is the JSON text the C side built, plus "updated_ms" (Redis's clock, so every
    writer agrees). It lives in <base>wl-status:<id>, with the entry's TTL when it has one.
]]

local function record_key(base, id) return base .. 'wl:' .. id end
local function status_key(base, id) return base .. 'wl-status:' .. id end

-- The fields of a record that a status reader reports with it: app, entry, node.
local function owner(base, id)
  local v = redis.call('HMGET', record_key(base, id), 'app', 'entry', 'node')
  if not v[1] then return nil end
  return {v[1], v[2] or '', v[3] or ''}
end

-- Writes a status JSON with updated_ms = now; ttl > 0 expires it, 0 keeps it forever, 'keep'
-- keeps the key's current TTL.
local function store_status(base, id, st, ttl)
  st.updated_ms = now_ms()
  local text = cjson.encode(st)
  if ttl == 'keep' then
    redis.call('SET', status_key(base, id), text, 'KEEPTTL')
  elseif ttl > 0 then
    redis.call('SET', status_key(base, id), text, 'EX', ttl)
  else
    redis.call('SET', status_key(base, id), text)
  end
  return text
end

-- Whose incarnation of workload id a node's instance at epoch is: 'OWN' (the record places that
-- epoch on that node, and no failover is placing it elsewhere), 'PLACING' (a failover is: the
-- record still names the lost node, and the instance is either that node's at the claimed epoch
-- or the one the failover is making on another node at the claimed epoch, which exists on its
-- engine before pv_wl_reincarnate moves the record there and must not be taken for a stale one),
-- 'MOVED' (the record is on another node, or at another epoch) or 'GONE' (no record); and the
-- record's node and epoch. A record without an epoch is at its first incarnation.
-- incarnation_of: the same from the record's node, epoch and placing fields already read.
local function incarnation_of(v_node, v_epoch, v_placing, node, epoch)
  local rec = {node = v_node, epoch = v_epoch or '1'}
  if not v_node then return 'GONE', rec end
  local placing = v_placing and v_placing ~= ''
  if tonumber(rec.epoch) ~= epoch then return 'MOVED', rec end
  if placing then return 'PLACING', rec end
  if v_node ~= node then return 'MOVED', rec end
  return 'OWN', rec
end

local function incarnation(base, id, node, epoch)
  local v = redis.call('HMGET', record_key(base, id), 'node', 'epoch', 'placing')
  return incarnation_of(v[1], v[2], v[3], node, epoch)
end

--[[ records ----------------------------------------------------------------------------------- ]]

-- A one-node deploy's agent takes the reservation's allocations one by one; the one that takes
-- the last ends the reservation (what a release finds then: nothing to give back, only the
-- record and its expiry entry to drop) in the same step, instead of a release's read of the
-- reservation, of its allocations and a call of its own. args[from..]: its other allocations,
-- every one of which must be gone from the node (taken by workloads) for it to end here.
local function end_reservation(base, allocs, resv_id, args, from)
  if #args >= from then
    for _, held in ipairs(redis.call('HMGET', allocs, unpack(args, from))) do
      if held then return false end
    end
  end
  redis.call('DEL', base .. 'resv:' .. resv_id)
  redis.call('ZREM', base .. 'resvs', resv_id)
  return true
end

-- pv_wl_add(KEYS[1]=nodes index, ARGV: base id name app entry pod node image privileged labels
-- env publish resources alloc_id engine_id deploy [resv other_alloc...]) -> the record. pod '' =
-- the node's pod; resources '' = the allocation taken over (alloc_id), else "{}". resv: the
-- reservation alloc_id is the last of, which held only this node's allocations (alloc_id and
-- the others named): it ends here when none of the others is left either, and the reply then
-- carries 'resv_ended' '1' after the record.
redis.register_function('pv_wl_add', function(keys, args)
  local base, id, node = args[1], args[2], args[7]
  local node_id, missing = find_id(keys[1], 'node', node)
  if not node_id then return missing end
  if redis.call('EXISTS', record_key(base, id)) == 1 then
    return err('ALREADY_EXISTS', 'workload ' .. id .. ' already exists')
  end
  local node_pod = redis.call('HGET', base .. 'node:' .. node_id, 'pod_name') or ''
  local pod = args[6]
  if pod == '' then pod = node_pod end
  if pod ~= node_pod then
    return err('INVALID_ARGUMENT', 'pod: node ' .. node .. ' is in pod ' .. node_pod ..
      ', not ' .. pod)
  end
  local resources, alloc_id = args[13], args[14]
  if alloc_id ~= '' then
    local allocs = base .. 'node-allocs:' .. node_id
    local held = redis.call('HGET', allocs, alloc_id)
    if not held then
      return err('FAILED_PRECONDITION', 'allocation ' .. alloc_id .. ' is not reserved on node ' ..
        node .. ' (its reservation was released)')
    end
    redis.call('HDEL', allocs, alloc_id)
    if resources == '' then resources = held end
  end
  if resources == '' then resources = '{}' end
  local key = record_key(base, id)
  local flat = {'id', id, 'name', args[3], 'app', args[4], 'entry', args[5],
    'pod', pod, 'node', node, 'node_id', node_id, 'image', args[8], 'privileged', args[9],
    'labels', args[10], 'env', args[11], 'publish', args[12], 'resources', resources,
    'alloc_id', alloc_id, 'engine_id', args[15], 'created_ms', tostring(now_ms()), 'epoch', '1',
    'placing', ''}
  redis.call('HSET', key, unpack(flat))
  if args[16] and args[16] ~= '' then redis.call('SET', base .. 'wl-deploy:' .. id, args[16]) end
  redis.call('ZADD', base .. 'wls', 0, id)
  redis.call('SADD', base .. 'node-workloads:' .. node_id, id)
  redis.call('SADD', base .. 'app-workloads:' .. args[4], id)
  -- the record is what was just written: no read back
  if alloc_id ~= '' and (args[17] or '') ~= '' and
      end_reservation(base, base .. 'node-allocs:' .. node_id, args[17], args, 18) then
    flat[#flat + 1] = 'resv_ended'
    flat[#flat + 1] = '1'
  end
  return flat
end)

-- Deletes the record, its status and its index entries (v = HMGET app node_id of the record).
local function remove_record(base, id, v)
  redis.call('DEL', record_key(base, id), status_key(base, id), base .. 'wl-deploy:' .. id)
  redis.call('ZREM', base .. 'wls', id)
  redis.call('SREM', base .. 'app-workloads:' .. v[1], id)
  if v[2] then redis.call('SREM', base .. 'node-workloads:' .. v[2], id) end
end

-- pv_wl_remove(ARGV: base id): the record, its status and its index entries.
redis.register_function('pv_wl_remove', function(keys, args)
  local base, id = args[1], args[2]
  local v = redis.call('HMGET', record_key(base, id), 'app', 'node_id')
  if not v[1] then return err('NOT_FOUND', 'workload ' .. id .. ' not found') end
  remove_record(base, id, v)
  return 1
end)

-- pv_wl_realloc(ARGV: base id expected_usage_rev usage resources): ReallocResource's record: the
-- workload's resources become `resources` and its node's usage `usage` (computed by the caller
-- from the usage it read at expected_usage_rev), in one step. -> 1, or 'CONFLICT'.
redis.register_function('pv_wl_realloc', function(keys, args)
  local base, id = args[1], args[2]
  local node_id = redis.call('HGET', record_key(base, id), 'node_id')
  if not node_id then return err('NOT_FOUND', 'workload ' .. id .. ' not found') end
  local node_key = base .. 'node:' .. node_id
  if (redis.call('HGET', node_key, 'usage_rev') or '0') ~= args[3] then return 'CONFLICT' end
  redis.call('HSET', node_key, 'usage', args[4], 'updated_ms', tostring(now_ms()))
  redis.call('HINCRBY', node_key, 'usage_rev', 1)
  redis.call('HINCRBY', node_key, 'rev', 1)
  node_changed(base, node_id)
  redis.call('HSET', record_key(base, id), 'resources', args[5])
  return 1
end)

-- pv_wl_remove_release(ARGV: base node_id expected_usage_rev usage node, then for each workload
-- id resources epoch): removes workloads of one node and gives what they held back to it in one
-- step, one node write for all of them: the node's usage becomes `usage` (computed by the
-- caller from the usage it read at expected_usage_rev, minus each workload's `resources`, as it
-- read them with its node_id), each deploy count drops by the workloads removed. Every record is
-- checked before anything is written, so the caller's arithmetic holds or nothing happens:
--   'CONFLICT'       the node's usage moved, or a record is gone, elsewhere or holds other
--                    resources than the caller read (read and compute again);
--   {'MOVED', id, e} epoch is not '' and the record is another incarnation than the node's
--                    instance at that epoch (incarnation(): replaced elsewhere, at epoch e): the
--                    caller answers that id with the refusal and tries the others again;
--   1                done. A node that is gone (a workload's record outlived it) is not written.
redis.register_function('pv_wl_remove_release', function(keys, args)
  local base, node_id, node = args[1], args[2], args[5]
  local ids, apps, counts = {}, {}, {}
  for i = 6, #args - 2, 3 do
    local id, epoch = args[i], args[i + 2]
    local v = redis.call('HMGET', record_key(base, id), 'app', 'node_id', 'entry', 'node',
      'resources', 'epoch', 'placing')
    if epoch ~= '' and v[1] then
      local inc, rec = incarnation_of(v[4], v[6], v[7], node, tonumber(epoch))
      if inc == 'MOVED' then return {'MOVED', id, rec.epoch} end
    end
    if not v[1] or v[2] ~= node_id or (v[5] or '{}') ~= args[i + 1] then return 'CONFLICT' end
    ids[#ids + 1] = id
    apps[v[1]] = apps[v[1]] or {}
    table.insert(apps[v[1]], id)
    local ck = base .. 'deploy-count:' .. v[1] .. ':' .. (v[3] or '')
    counts[ck] = counts[ck] or {}
    counts[ck][v[4] or ''] = (counts[ck][v[4] or ''] or 0) + 1
  end
  if #ids == 0 then return 1 end
  local node_key = base .. 'node:' .. node_id
  local revs = node_revs(node_key)
  if revs then
    if revs.usage_rev ~= args[3] then return 'CONFLICT' end
    node_set_usage(node_key, revs, args[4], tostring(now_ms()))
    for ck, by_node in pairs(counts) do
      for n, c in pairs(by_node) do
        if redis.call('HINCRBY', ck, n, -c) <= 0 then redis.call('HDEL', ck, n) end
      end
    end
  end
  -- what remove_record does for one, once for all of them
  local dels = {}
  for _, id in ipairs(ids) do
    dels[#dels + 1] = record_key(base, id)
    dels[#dels + 1] = status_key(base, id)
    dels[#dels + 1] = base .. 'wl-deploy:' .. id
  end
  redis.call('DEL', unpack(dels))
  redis.call('ZREM', base .. 'wls', unpack(ids))
  for app, of_app in pairs(apps) do
    redis.call('SREM', base .. 'app-workloads:' .. app, unpack(of_app))
  end
  redis.call('SREM', base .. 'node-workloads:' .. node_id, unpack(ids))
  return 1
end)

-- pv_wl_get(ARGV: base id) -> the record.
redis.register_function{function_name = 'pv_wl_get', flags = {'no-writes'},
  callback = function(keys, args)
    local rec = redis.call('HGETALL', record_key(args[1], args[2]))
    if #rec == 0 then return err('NOT_FOUND', 'workload ' .. args[2] .. ' not found') end
    return rec
  end}

-- pv_wl_deploy(ARGV: base id) -> the base64 DeployOptions the workload was made from.
redis.register_function{function_name = 'pv_wl_deploy', flags = {'no-writes'},
  callback = function(keys, args)
    if redis.call('EXISTS', record_key(args[1], args[2])) == 0 then
      return err('NOT_FOUND', 'workload ' .. args[2] .. ' not found')
    end
    local d = redis.call('GET', args[1] .. 'wl-deploy:' .. args[2])
    if not d then
      return err('FAILED_PRECONDITION', 'workload ' .. args[2] ..
        ' has no deploy options recorded to make another like it')
    end
    return d
  end}

-- Whether a record (flat array) matches: app, entry and node '' = any; every label of want (a
-- table) must be the record's.
local function matches(rec, app, entry, node, want)
  if #rec == 0 then return false end
  local f = {}
  for i = 1, #rec, 2 do f[rec[i]] = rec[i + 1] end
  if (app ~= '' and f.app ~= app) or (entry ~= '' and f.entry ~= entry) or
     (node ~= '' and f.node ~= node) then
    return false
  end
  if next(want) == nil then return true end
  local ok, have = pcall(cjson.decode, f.labels or '{}')
  if not ok or type(have) ~= 'table' then return false end
  for k, v in pairs(want) do
    if have[k] ~= v then return false end
  end
  return true
end

-- pv_wl_list(KEYS[1]=nodes index, ARGV: base app entry node labels_json) -> the matching
-- records, id order. The narrowest index is read: the node's set, the app's set, or every id.
redis.register_function{function_name = 'pv_wl_list', flags = {'no-writes'},
  callback = function(keys, args)
    local base, app, entry, node = args[1], args[2], args[3], args[4]
    local want = cjson.decode(args[5])
    local ids
    if node ~= '' then
      local node_id = redis.call('HGET', keys[1], node)
      if not node_id then return {} end
      ids = redis.call('SMEMBERS', base .. 'node-workloads:' .. node_id)
      table.sort(ids)
    elseif app ~= '' then
      ids = redis.call('SMEMBERS', base .. 'app-workloads:' .. app)
      table.sort(ids)
    else
      ids = redis.call('ZRANGE', base .. 'wls', 0, -1)
    end
    local out = {}
    for _, id in ipairs(ids) do
      local rec = redis.call('HGETALL', record_key(base, id))
      if matches(rec, app, entry, node, want) then out[#out + 1] = rec end
    end
    return out
  end}

--[[ statuses ---------------------------------------------------------------------------------- ]]

-- pv_wl_set_status(ARGV: base n, then n times: id status_json ttl) -> n entries {id, status
-- as stored, app, entry, node}. Every workload must exist, else nothing is written.
redis.register_function('pv_wl_set_status', function(keys, args)
  local base, n = args[1], tonumber(args[2])
  local owners = {}
  for i = 1, n do
    local id = args[3 * i]
    owners[i] = owner(base, id)
    if not owners[i] then return err('NOT_FOUND', 'workload ' .. id .. ' not found') end
  end
  local out = {}
  for i = 1, n do
    local id, ttl = args[3 * i], tonumber(args[3 * i + 2])
    local text = store_status(base, id, cjson.decode(args[3 * i + 1]), ttl)
    out[i] = {id, text, owners[i][1], owners[i][2], owners[i][3]}
  end
  return out
end)

-- pv_wl_report_status(ARGV: base 1 id status_json ttl reporter epoch) -> as pv_wl_set_status.
-- A node agent's report is a fenced write: refused FAILED_PRECONDITION ('stale report: ...'),
-- nothing written, unless the record places incarnation `epoch` on node `reporter` (and no
-- failover is placing the next one).
redis.register_function('pv_wl_report_status', function(keys, args)
  local base, id, reporter, epoch = args[1], args[3], args[6], tonumber(args[7]) or 1
  local who = owner(base, id)
  if not who then return err('NOT_FOUND', 'workload ' .. id .. ' not found') end
  local verdict, rec = incarnation(base, id, reporter, epoch)
  if verdict ~= 'OWN' then
    return err('FAILED_PRECONDITION', 'stale report: workload ' .. id .. ' is incarnation ' ..
      rec.epoch .. ' on node ' .. (rec.node or '?') .. ' (' .. verdict .. '), not incarnation ' ..
      epoch .. ' on ' .. reporter)
  end
  local text = store_status(base, id, cjson.decode(args[4]), tonumber(args[5]))
  return {{id, text, who[1], who[2], who[3]}}
end)

-- pv_wl_get_status(ARGV: base id) -> {status, app, entry, node}.
redis.register_function{function_name = 'pv_wl_get_status', flags = {'no-writes'},
  callback = function(keys, args)
    local base, id = args[1], args[2]
    local text = redis.call('GET', status_key(base, id))
    local who = text and owner(base, id)
    if not who then return err('NOT_FOUND', 'status of workload ' .. id .. ' not found') end
    return {text, who[1], who[2], who[3]}
  end}

-- pv_wl_status_view(ARGV: base id) -> {status or '', record or {}}: what a status watcher
-- streams for one change of the workload's status key.
redis.register_function{function_name = 'pv_wl_status_view', flags = {'no-writes'},
  callback = function(keys, args)
    local base, id = args[1], args[2]
    return {redis.call('GET', status_key(base, id)) or '',
            redis.call('HGETALL', record_key(base, id))}
  end}

-- pv_wl_status_page(ARGV: base after limit) -> {last id scanned ('' at the end), entries}:
-- the workloads after id `after` (id order) that have a live status, each {id, updated_ms, app,
-- entry, node, labels}. A watcher reads every live status in pages with it.
redis.register_function{function_name = 'pv_wl_status_page', flags = {'no-writes'},
  callback = function(keys, args)
    local base, after, limit = args[1], args[2], tonumber(args[3])
    local from = '-'
    if after ~= '' then from = '(' .. after end
    local ids = redis.call('ZRANGE', base .. 'wls', from, '+', 'BYLEX', 'LIMIT', 0, limit)
    local out = {}
    for _, id in ipairs(ids) do
      local text = redis.call('GET', status_key(base, id))
      if text then
        local ok, st = pcall(cjson.decode, text)
        local at = (ok and type(st) == 'table' and tonumber(st.updated_ms)) or 0
        local v = redis.call('HMGET', record_key(base, id), 'app', 'entry', 'node', 'labels')
        out[#out + 1] = {id, tostring(at), v[1] or '', v[2] or '', v[3] or '', v[4] or '{}'}
      end
    end
    local last = ''
    if #ids == limit then last = ids[#ids] end
    return {last, out}
  end}

-- pv_wl_mark_node_down(KEYS[1]=nodes index, ARGV: base node) -> how many workloads were marked.
-- Each workload of the node gets running = healthy = false; an existing status keeps its other
-- fields and its TTL, a workload without one gets a status without expiry (as Eru writes it).
redis.register_function('pv_wl_mark_node_down', with_id(1, 'node', function(keys, args, node_id)
  local base = args[1]
  local ids = redis.call('SMEMBERS', base .. 'node-workloads:' .. node_id)
  table.sort(ids)
  for _, id in ipairs(ids) do
    local text = redis.call('GET', status_key(base, id))
    local ok, st = false, nil
    if text then ok, st = pcall(cjson.decode, text) end
    if ok and type(st) == 'table' then
      st.running, st.healthy = false, false
      store_status(base, id, st, 'keep')
    else
      store_status(base, id, {running = false, healthy = false, ttl = 0}, 0)
    end
  end
  return #ids
end))

-- The ids of the nodes whose alive key is gone. With the schedulers' change index built, its
-- liveness set answers (node-alive: id -> when the alive key expires, kept by every writer of an
-- alive key, shared/store/redis/sched.lua): one range read, not an EXISTS per node of the
-- registry on every tick. Without it (records older than the index), every node is asked.
local function dead_node_ids(nodes, base)
  if redis.call('HEXISTS', base .. 'node-index', 'epoch') == 1 then
    return redis.call('ZRANGEBYSCORE', base .. 'node-alive', '-inf', '(' .. now_ms())
  end
  local dead, index = {}, redis.call('HGETALL', nodes)
  for i = 1, #index, 2 do
    if redis.call('EXISTS', base .. 'alive:' .. index[i]) == 0 then
      dead[#dead + 1] = index[i + 1]
    end
  end
  return dead
end

-- pv_wl_mark_dead_nodes(KEYS[1]=nodes index, ARGV: base) -> how many workloads were marked.
-- What Eru's self-monitor does when a node's liveness ends: every workload of a node whose alive
-- key is gone is marked not running and not healthy. Idempotent: a workload already marked down
-- is left alone, so running it on every scheduler tick writes (and notifies) only real changes.
redis.register_function('pv_wl_mark_dead_nodes', function(keys, args)
  local base = args[1]
  local marked = 0
  for _, node_id in ipairs(dead_node_ids(keys[1], base)) do
    for _, id in ipairs(redis.call('SMEMBERS', base .. 'node-workloads:' .. node_id)) do
      local text = redis.call('GET', status_key(base, id))
      local ok, st = false, nil
      if text then ok, st = pcall(cjson.decode, text) end
      if ok and type(st) == 'table' then
        if st.running ~= false or st.healthy ~= false then
          st.running, st.healthy = false, false
          store_status(base, id, st, 'keep')
          marked = marked + 1
        end
      else
        store_status(base, id, {running = false, healthy = false, ttl = 0}, 0)
        marked = marked + 1
      end
    end
  end
  return marked
end)

--[[ high availability (workers/ops/wk_ha.h) ------------------------------------------------- ]]

-- Whether a record's labels (JSON text) ask for recovery: pivirt.io/ha = restart.
local function is_ha(labels)
  local ok, l = pcall(cjson.decode, labels or '{}')
  return ok and type(l) == 'table' and l['pivirt.io/ha'] == 'restart'
end

local function ha_count(base, node_id)
  local n = 0
  for _, id in ipairs(redis.call('SMEMBERS', base .. 'node-workloads:' .. node_id)) do
    if is_ha(redis.call('HGET', record_key(base, id), 'labels')) then n = n + 1 end
  end
  return n
end

-- pv_ha_scan(KEYS[1]=nodes index, ARGV: base) -> {{node, node_id, change, ha workloads, downs}}:
-- the nodes whose readiness changed since the last scan, by any ops worker ('down': its alive
-- key is gone, 'up': it is back) and those down with a failover still to submit ('pending').
-- The state (<base>ha:ready: node id -> '1' ready, '0' not ready, '0p' not ready with its
-- failover not yet submitted) changes in the same call that reports it, so however many ops
-- workers scan, each change is reported once. A node seen for the first time is recorded as it
-- is, without a change: it never was ready as far as the scans know.
redis.register_function('pv_ha_scan', function(keys, args)
  local base = args[1]
  local state_key, downs_key = base .. 'ha:ready', base .. 'ha:downs'
  local index = redis.call('HGETALL', keys[1])
  local known, out = {}, {}
  for i = 1, #index, 2 do
    local node, node_id = index[i], index[i + 1]
    known[node_id] = true
    local alive = redis.call('EXISTS', base .. 'alive:' .. node) == 1
    local prev = redis.call('HGET', state_key, node_id)
    if not prev then
      redis.call('HSET', state_key, node_id, alive and '1' or '0')
    elseif alive and prev ~= '1' then
      redis.call('HSET', state_key, node_id, '1')
      out[#out + 1] = {node, node_id, 'up', 0, 0}
    elseif not alive and prev == '1' then
      local n = ha_count(base, node_id)
      local downs = redis.call('HINCRBY', downs_key, node_id, 1)
      redis.call('HSET', state_key, node_id, n > 0 and '0p' or '0')
      out[#out + 1] = {node, node_id, 'down', n, downs}
    elseif not alive and prev == '0p' then
      out[#out + 1] = {node, node_id, 'pending', ha_count(base, node_id),
                       tonumber(redis.call('HGET', downs_key, node_id) or '1')}
    end
  end
  for _, f in ipairs({state_key, downs_key}) do
    local ids = redis.call('HKEYS', f)
    for _, id in ipairs(ids) do
      if not known[id] then redis.call('HDEL', f, id) end
    end
  end
  return out
end)

-- pv_ha_ack(ARGV: base node_id): the failover of a down node is submitted.
redis.register_function('pv_ha_ack', function(keys, args)
  local key = args[1] .. 'ha:ready'
  if redis.call('HGET', key, args[2]) == '0p' then redis.call('HSET', key, args[2], '0') end
  return 1
end)

-- pv_wl_ha_check(ARGV: base id node epoch) -> {verdict, record's node, record's epoch}: what
-- a node agent's instance at epoch is (incarnation above).
redis.register_function{function_name = 'pv_wl_ha_check', flags = {'no-writes'},
  callback = function(keys, args)
    local verdict, rec = incarnation(args[1], args[2], args[3], tonumber(args[4]) or 1)
    if verdict == 'GONE' then return {verdict, '', '0'} end
    return {verdict, rec.node or '', rec.epoch}
  end}

-- pv_wl_ha_claim(ARGV: base id node op) -> the new incarnation's epoch. A failover `op` takes
-- workload id away from `node`, whose alive key must be gone (FAILED_PRECONDITION 'node ...
-- is alive' otherwise: it fenced nothing and keeps its workload): the epoch goes up, so from
-- now on every write of the node's instance is stale, and `placing` says who places the next
-- one. Its status says not running. Again by the same op: the same epoch.
redis.register_function('pv_wl_ha_claim', function(keys, args)
  local base, id, node, op = args[1], args[2], args[3], args[4]
  local key = record_key(base, id)
  local v = redis.call('HMGET', key, 'node', 'epoch', 'placing')
  if not v[1] then return err('NOT_FOUND', 'workload ' .. id .. ' not found') end
  local epoch = tonumber(v[2] or '1')
  if v[3] == op then return epoch end
  if v[1] ~= node then
    return err('FAILED_PRECONDITION', 'workload ' .. id .. ' is on node ' .. v[1] .. ', not ' .. node)
  end
  if v[3] and v[3] ~= '' then
    return err('ABORTED', 'workload ' .. id .. ' is being placed by operation ' .. v[3])
  end
  if redis.call('EXISTS', base .. 'alive:' .. node) == 1 then
    return err('FAILED_PRECONDITION', 'node ' .. node .. ' is alive: workload ' .. id ..
      ' stays there')
  end
  epoch = epoch + 1
  redis.call('HSET', key, 'epoch', tostring(epoch), 'placing', op)
  store_status(base, id, {running = false, healthy = false, ttl = 0}, 0)
  return epoch
end)

-- pv_wl_ha_unclaim(ARGV: base id op) -> 1 when op's claim was undone: its replacement could not
-- be placed, so no newer incarnation exists and the one on the old node is the workload's
-- again (epoch back to it, nothing placing).
redis.register_function('pv_wl_ha_unclaim', function(keys, args)
  local key = record_key(args[1], args[2])
  local v = redis.call('HMGET', key, 'epoch', 'placing')
  if v[2] ~= args[3] then return 0 end
  redis.call('HSET', key, 'epoch', tostring(tonumber(v[1] or '2') - 1), 'placing', '')
  return 1
end)

-- pv_wl_reincarnate(KEYS[1]=nodes index, ARGV: base id old_rev old_usage node epoch alloc_id
-- engine_id labels) -> the record (labels '' = kept). The replacement of a claimed workload was made on `node` at
-- `epoch`: the record moves there (sets, node, engine id), takes the reservation's allocation
-- alloc_id over as pv_wl_add does, and gives what it held back to the old node, whose usage
-- becomes old_usage (computed by the caller at old_rev: 'CONFLICT' when it moved). Another
-- epoch is FAILED_PRECONDITION (a newer claim, or an undone one); done already: the record.
redis.register_function('pv_wl_reincarnate', function(keys, args)
  local base, id, node, epoch, alloc_id = args[1], args[2], args[5], args[6], args[7]
  local key = record_key(base, id)
  local v = redis.call('HMGET', key, 'node', 'node_id', 'epoch', 'placing', 'app', 'entry')
  if not v[1] then return err('NOT_FOUND', 'workload ' .. id .. ' not found') end
  if (v[3] or '1') ~= epoch then
    return err('FAILED_PRECONDITION', 'workload ' .. id .. ' is at incarnation ' .. (v[3] or '1') ..
      ', not ' .. epoch)
  end
  if v[1] == node and (v[4] or '') == '' then return redis.call('HGETALL', key) end
  local node_id, missing = find_id(keys[1], 'node', node)
  if not node_id then return missing end
  local old_key = base .. 'node:' .. (v[2] or '')
  local old_exists = v[2] and redis.call('EXISTS', old_key) == 1
  if old_exists and (redis.call('HGET', old_key, 'usage_rev') or '0') ~= args[3] then
    return 'CONFLICT'
  end
  local resources = '{}'
  if alloc_id ~= '' then
    local held = redis.call('HGET', base .. 'node-allocs:' .. node_id, alloc_id)
    if not held then
      return err('FAILED_PRECONDITION', 'allocation ' .. alloc_id .. ' is not reserved on node ' ..
        node .. ' (its reservation was released)')
    end
    redis.call('HDEL', base .. 'node-allocs:' .. node_id, alloc_id)
    resources = held
  end
  if old_exists then
    redis.call('HSET', old_key, 'usage', args[4], 'updated_ms', tostring(now_ms()))
    redis.call('HINCRBY', old_key, 'usage_rev', 1)
    redis.call('HINCRBY', old_key, 'rev', 1)
    node_changed(base, v[2])
    local counts = base .. 'deploy-count:' .. (v[5] or '') .. ':' .. (v[6] or '')
    if redis.call('HINCRBY', counts, v[1], -1) <= 0 then redis.call('HDEL', counts, v[1]) end
  end
  if v[2] then redis.call('SREM', base .. 'node-workloads:' .. v[2], id) end
  redis.call('SADD', base .. 'node-workloads:' .. node_id, id)
  redis.call('HSET', key, 'node', node, 'node_id', node_id, 'engine_id', args[8], 'resources',
    resources, 'alloc_id', alloc_id, 'placing', '')
  if args[9] and args[9] ~= '' then redis.call('HSET', key, 'labels', args[9]) end
  redis.call('DEL', status_key(base, id))
  return redis.call('HGETALL', key)
end)

redis.register_function{function_name = 'pv_workload_version', flags = {'no-writes'},
  callback = function(keys, args) return 1 end}
