"""The local stack's order-event plumbing on moto (scripts/stack.sh up_events), made with
boto3, AWS's own SDK: the bus, the SQS queue a consumer reads, and the rule that sends
every event of `seckill.orders` on the bus to the queue (as template.yaml does in AWS).
Idempotent: what exists is kept. Prints the queue's URL.

usage: events-setup.py ENDPOINT BUS QUEUE
"""

import json
import sys

import boto3

SOURCE = "seckill.orders"


def main() -> None:
    endpoint, bus, queue = sys.argv[1:4]
    kw = dict(
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    events = boto3.client("events", **kw)
    sqs = boto3.client("sqs", **kw)
    names = [b["Name"] for b in events.list_event_buses().get("EventBuses", [])]
    if bus not in names:
        events.create_event_bus(Name=bus)
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    rule = f"{bus}-to-{queue}"
    events.put_rule(
        Name=rule, EventBusName=bus, EventPattern=json.dumps({"source": [SOURCE]})
    )
    events.put_targets(
        Rule=rule, EventBusName=bus, Targets=[{"Id": "consumer-queue", "Arn": arn}]
    )
    print(url)


if __name__ == "__main__":
    main()
