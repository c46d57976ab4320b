// Stripe's official Node SDK, driven from the command line: what a shop's buyer page
// and Stripe itself do, for the Rust tests and `seckill pay --stripe`, against the
// Stripe at STRIPE_API_BASE (the local stack's localstripe) with STRIPE_SECRET_KEY.
// Every command prints one JSON value (or a header line) on stdout.
//
//   node sdk.mjs confirm <payment_intent> <card number>   attach a card and confirm;
//        prints the PaymentIntent as it stands after (declined cards included)
//   node sdk.mjs authenticate <payment_intent> <true|false>  the buyer passes (or fails)
//        3-D Secure for a PaymentIntent that `requires_action`
//   node sdk.mjs intent <payment_intent>                 the PaymentIntent
//   node sdk.mjs charge <charge>                         the charge
//   node sdk.mjs refunds <payment_intent>                its refunds (a list)
//   node sdk.mjs sign <whsec secret> [unix seconds]      the Stripe-Signature header of
//        the payload on stdin, made by the SDK's own test helper
import Stripe from 'stripe';

const [cmd, ...args] = process.argv.slice(2);

function client() {
  const base = new URL(process.env.STRIPE_API_BASE ?? 'https://api.stripe.com');
  const key = process.env.STRIPE_SECRET_KEY;
  if (!key) throw new Error('STRIPE_SECRET_KEY is not set');
  return new Stripe(key, {
    host: base.hostname,
    port: Number(base.port || (base.protocol === 'https:' ? 443 : 80)),
    protocol: base.protocol.replace(':', ''),
    maxNetworkRetries: 2,
    timeout: 10000,
  });
}

async function readStdin() {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  return Buffer.concat(chunks).toString('utf8');
}

const print = (v) => process.stdout.write(JSON.stringify(v) + '\n');

switch (cmd) {
  case 'confirm': {
    const [intent, number] = args;
    const stripe = client();
    const method = await stripe.paymentMethods.create({
      type: 'card',
      card: { number, exp_month: 12, exp_year: new Date().getFullYear() + 3, cvc: '123' },
    });
    // localstripe's confirm takes no payment_method: set it on the intent first, as
    // Stripe also allows.
    await stripe.paymentIntents.update(intent, { payment_method: method.id });
    try {
      await stripe.paymentIntents.confirm(intent);
    } catch (e) {
      // A declined card: the PaymentIntent says so (status, last_payment_error).
      if (e.type !== 'StripeCardError') throw e;
    }
    print(await stripe.paymentIntents.retrieve(intent));
    break;
  }
  case 'authenticate': {
    const [intent, success] = args;
    const stripe = client();
    const pi = await stripe.paymentIntents.retrieve(intent);
    // The 3-D Secure step a buyer's browser takes (localstripe's own endpoint for it).
    await stripe.rawRequest('POST', `/v1/payment_intents/${intent}/_authenticate`, {
      client_secret: pi.client_secret,
      success,
    });
    print(await stripe.paymentIntents.retrieve(intent));
    break;
  }
  case 'intent':
    print(await client().paymentIntents.retrieve(args[0]));
    break;
  case 'charge':
    print(await client().charges.retrieve(args[0]));
    break;
  case 'refunds':
    print((await client().refunds.list({ payment_intent: args[0], limit: 100 })).data);
    break;
  case 'sign': {
    const [secret, timestamp] = args;
    const payload = await readStdin();
    const header = Stripe.webhooks.generateTestHeaderString({
      payload,
      secret,
      ...(timestamp ? { timestamp: Number(timestamp) } : {}),
    });
    process.stdout.write(header + '\n');
    break;
  }
  default:
    process.stderr.write(`unknown command ${cmd}: see the head of ${process.argv[1]}\n`);
    process.exit(2);
}
