"""Small command scripts the batch and drive tests write into their workspaces."""

RECORDER = r'''
import json, os, sys
# invoke ITEM KEY OUT: record the exact arguments as received; observe KEY OUT: present when recorded.
mode = sys.argv[1]
if mode == "invoke":
    item, key, out = sys.argv[2:5]
    with open(os.path.join(out, key + ".json"), "w") as handle:
        json.dump({"argv": sys.argv[1:]}, handle)
    print(json.dumps({"recorded": key}))
    sys.exit(0)
key, out = sys.argv[2:4]
path = os.path.join(out, key + ".json")
if os.path.exists(path):
    print(json.dumps({"seen": key}))
    sys.exit(0)
sys.exit(1)
'''
