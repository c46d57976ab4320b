//! Fairness at the edge, end to end: `seckill-load fairness`, small, against the running
//! stack over real HTTP. Bots polling the queue and the admission at their limit and
//! people looking every few seconds wait behind the first buyers, some of whom cancel
//! and some let their order expire (the stack's drainer runs every second); one client
//! floods the voucher read meanwhile. With the line, one stock bucket or three (whose
//! returned units cross slots to the line and on to the offered buyer), every returned
//! unit goes to the earliest waiting position still looking, and every page read is
//! served while the flood is refused at the edge.

use seckill_load::fairness::{self, FairnessOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_returned_unit_goes_to_the_earliest_position_still_looking() {
    let env = seckill_cli::stack_env::StackEnv::load(None).expect("the stack is up");
    let o = FairnessOptions {
        stock: 8,
        bots: 8,
        people: 10,
        return_share: 0.4,
        pay_window_s: 8,
        seconds: 60,
        flood_per_s: 100,
        seed: 5,
        quiet: true,
    };
    let report = fairness::fairness(&env, &o)
        .await
        .expect("the scenario runs");
    println!("{}", report.render());
    for line in [&report.line, &report.buckets] {
        assert!(line.returned > 0, "the seed returns units: {line:?}");
        assert_eq!(
            line.rebought_by_people + line.rebought_by_bots,
            line.returned,
            "every returned unit was bought again: {line:?}"
        );
        assert_eq!(line.overtakes, 0, "{line:?}");
        assert_eq!(line.people_overtaken_by_bots, 0, "{line:?}");
    }
    for run in [&report.line, &report.buckets] {
        assert_eq!(run.page_reads_ok, run.page_reads, "{run:?}");
        assert!(
            run.flood_limited > 0,
            "the flood met the edge's limit: {run:?}"
        );
    }
}
