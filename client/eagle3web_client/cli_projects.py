"""`eagle3web projects list|create|members list|add|remove`: projects and their members from a shell.

A project is named by its id or its exact name. Without --json: `list` a line per project (id, your role,
runs, name, tab-separated; "open" after the role for a project every signed-in user sees), `create` the new
project's id alone (P=$(eagle3web projects create "kimi drafts")), `members list|add` a line per member
(username, role), `remove` "removed USER from PROJECT"."""
from __future__ import annotations

import argparse
from typing import Any

from eagle3web_client.client import Client

ROLES = ("viewer", "editor", "owner")


def add_parsers(groups: argparse._SubParsersAction) -> None:
    projects = groups.add_parser("projects", help="projects and their members").add_subparsers(
        dest="command", required=True)
    projects.add_parser("list", help="the projects whose runs you see, with your role")
    projects.add_parser("create", help="a new closed project owned by you; prints its id").add_argument("name")
    members = projects.add_parser("members", help="a project's members").add_subparsers(
        dest="members_command", required=True)
    members.add_parser("list", help="the members and their roles").add_argument("project", help="its id or name")
    add = members.add_parser("add", help="add a user, or change their role (owners and staff)")
    add.add_argument("project", help="its id or name")
    add.add_argument("username")
    add.add_argument("--role", choices=ROLES, default="viewer")
    remove = members.add_parser("remove", help="remove a member (owners and staff; the last owner stays)")
    remove.add_argument("project", help="its id or name")
    remove.add_argument("username")


def project_command(client: Client, args: argparse.Namespace) -> Any:
    projects = client.projects
    if args.command == "list":
        return projects.list()
    if args.command == "create":
        return projects.create(args.name)
    if args.members_command == "list":
        return projects.members(args.project)
    if args.members_command == "add":
        return projects.member_set(args.project, args.username, args.role)
    projects.member_remove(args.project, args.username)
    return {"project": args.project, "removed": args.username}


def project_text(args: argparse.Namespace, answer: Any) -> tuple[str, str]:
    """(stdout, stderr) without --json."""
    if args.command == "list":
        rows = [f"{p['id']}\t{p.get('role') or '-'}{' open' if p.get('open_to_all') else ''}\t{p.get('runs')}\t"
                f"{' '.join(str(p.get('name')).split())}" for p in answer]
        return ("\n".join(rows), "") if rows else ("", "eagle3web: no projects")
    if args.command == "create":
        return str(answer["id"]), ""
    if args.members_command == "remove":
        return f"removed {args.username} from {args.project}", ""
    rows = [f"{m['username']}\t{m['role']}" for m in answer.get("results", [])]
    return ("\n".join(rows), "") if rows else ("", f"eagle3web: {answer.get('name')} has no members by name")
