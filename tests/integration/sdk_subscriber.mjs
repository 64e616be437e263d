// Subscribe to one event stream with the official JS SDK (@opencode-ai/sdk) and print what the
// subscription does as JSON lines: {"event": ...} per event, {"error": "..."} each time the SDK
// sees the stream fail (it reconnects after each), {"ended": true} when the subscription stops.
//
// usage: node sdk_subscriber.mjs <baseUrl> global|instance|default|session [directory|sessionID]
// (`default`: the client created with no directory, on plain `/event`, as most SDK users have it)
import { createOpencodeClient } from "@opencode-ai/sdk"
import { createOpencodeClient as createV2Client } from "@opencode-ai/sdk/v2"

const [baseUrl, kind, argument] = process.argv.slice(2)

// opencode 1.18.33 can leave a request sent the instant its port opens after a restart unanswered
// for minutes (measured here: > 90 s), and the SDK's fetch has no timeout: a request that gets no
// response headers in time fails instead, which the SDK retries like any other error. The same
// for direct and proxied subscriptions; it changes nothing once a stream has started.
const HEADERS_TIMEOUT_MS = 10_000
const fetchOnce = globalThis.fetch
globalThis.fetch = async (input, init) => {
  const late = new AbortController()
  const timer = setTimeout(() => late.abort(new Error("no response headers in time")), HEADERS_TIMEOUT_MS)
  const own = init?.signal ?? (input instanceof Request ? input.signal : undefined)
  const signal = own ? AbortSignal.any([own, late.signal]) : late.signal
  try {
    return await fetchOnce(input, { ...init, signal })
  } finally {
    clearTimeout(timer)
  }
}
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n")
// Short pauses between reconnects keep the test quick; whether it reconnects is the SDK's own logic.
const retry = { sseDefaultRetryDelay: 250, sseMaxRetryDelay: 1000, onSseError: (error) => say({ error: String(error) }) }

let subscription
if (kind === "global") {
  subscription = await createOpencodeClient({ baseUrl }).global.event(retry)
} else if (kind === "instance") {
  subscription = await createOpencodeClient({ baseUrl }).event.subscribe({ ...retry, query: { directory: argument } })
} else if (kind === "default") {
  subscription = await createOpencodeClient({ baseUrl }).event.subscribe(retry)
} else if (kind === "session") {
  subscription = await createV2Client({ baseUrl }).v2.session.events({ sessionID: argument }, retry)
} else {
  throw new Error(`unknown stream ${kind}`)
}
for await (const event of subscription.stream) say({ event })
say({ ended: true })
