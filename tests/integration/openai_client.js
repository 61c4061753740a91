// The `openai` npm package (4.x) against an OpenAI-compatible server:
// one non-streamed and one streamed completion of the same greedy request.
// Prints one JSON line: both answers as the client library decoded them.
// Usage: node openai_client.js BASE_URL PROMPT MAX_TOKENS (NODE_PATH finds openai).
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default || mod;

async function main() {
  const [baseURL, prompt, maxTokens] = process.argv.slice(2);
  const client = new OpenAI({ baseURL: baseURL + '/v1', apiKey: process.env.OPENAI_API_KEY || 'none',
                              maxRetries: 0, timeout: 60000 });
  // The served model, as clients find it (RLSYNC_MODEL: a server without /v1/models).
  const model = process.env.RLSYNC_MODEL || (await client.models.list()).data[0].id;
  const request = { model, prompt, max_tokens: Number(maxTokens), temperature: 0, logprobs: 0,
                    return_token_ids: true };
  const whole = await client.completions.create(request);
  const stream = await client.completions.create({ ...request, stream: true,
                                                   stream_options: { include_usage: true } });
  const streamed = { text: '', token_ids: [], finish_reason: null, weight_versions: null, usage: null, chunks: 0 };
  for await (const chunk of stream) {
    streamed.chunks += 1;
    if (chunk.usage)
      streamed.usage = chunk.usage;
    for (const c of chunk.choices) {
      streamed.text += c.text;
      streamed.token_ids.push(...(c.token_ids || []));
      if (c.finish_reason)
        streamed.finish_reason = c.finish_reason;
      if (c.weight_versions)
        streamed.weight_versions = c.weight_versions;
    }
  }
  const c = whole.choices[0];
  console.log(JSON.stringify({
    model, id: whole.id, object: whole.object, text: c.text, token_ids: c.token_ids,
    finish_reason: c.finish_reason, weight_versions: c.weight_versions, logprobs: c.logprobs,
    usage: whole.usage, streamed }));
}

main().catch((e) => { console.error('openai client: ' + (e && e.stack || e)); process.exit(1); });
