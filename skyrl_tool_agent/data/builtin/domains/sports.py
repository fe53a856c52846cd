"""Football league: teams, players, matches and per-match player statistics."""

from __future__ import annotations

import itertools
import random

from skyrl_tool_agent.data.builtin.names import CITIES, NOUNS, iso_date, maybe, person_names, plural, skewed_choices
from skyrl_tool_agent.data.builtin.schema import Domain, Row, T, Table

POSITIONS = ("Goalkeeper", "Defender", "Defender", "Midfielder", "Midfielder", "Forward")
NATIONALITIES = ("Brazil", "France", "Ghana", "Japan", "Mexico", "Norway", "Portugal", "Spain")

TABLES = (
    Table("teams", (
        ("team_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("city", "TEXT"),
        ("founded_year", "INTEGER"), ("coach", "TEXT"),
    )),
    Table("players", (
        ("player_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("team_id", "INTEGER"),
        ("position", "TEXT"), ("birth_date", "TEXT"), ("jersey_number", "INTEGER"), ("nationality", "TEXT"),
    ), (("team_id", "teams", "team_id"),)),
    Table("matches", (
        ("match_id", "INTEGER PRIMARY KEY"), ("home_team_id", "INTEGER NOT NULL"), ("away_team_id", "INTEGER NOT NULL"),
        ("match_date", "TEXT"), ("home_score", "INTEGER"), ("away_score", "INTEGER"), ("attendance", "INTEGER"),
    ), (("home_team_id", "teams", "team_id"), ("away_team_id", "teams", "team_id"))),
    Table("player_stats", (
        ("stat_id", "INTEGER PRIMARY KEY"), ("player_id", "INTEGER NOT NULL"), ("match_id", "INTEGER NOT NULL"),
        ("goals", "INTEGER"), ("assists", "INTEGER"), ("minutes_played", "INTEGER"),
    ), (("player_id", "players", "player_id"), ("match_id", "matches", "match_id"))),
)


def populate(rng: random.Random) -> dict[str, list[Row]]:
    team_names = rng.sample([f"{city} {plural(noun)}" for city, _ in CITIES for noun in NOUNS], 20)
    founded = rng.sample(range(1880, 2005), 20)
    coaches = person_names(rng, 20)
    teams = [(i, name, name.rsplit(" ", 1)[0], founded[i - 1], maybe(rng, coaches[i - 1], 0.1))
             for i, name in enumerate(team_names, 1)]
    players = []
    for i, name in enumerate(person_names(rng, 160), 1):
        team = (i - 1) % 20 + 1 if i <= 140 else None  # 20 free agents without a team
        players.append((i, name, team, rng.choice(POSITIONS), iso_date(rng, "1988-01-01", "2006-12-31"),
                        rng.randint(1, 30), rng.choice(NATIONALITIES)))
    pairs = list(itertools.combinations(range(1, 21), 2))
    rng.shuffle(pairs)
    matches = []
    for i, (a, b) in enumerate(pairs, 1):
        home, away = (a, b) if rng.random() < 0.5 else (b, a)
        matches.append((i, home, away, iso_date(rng, "2023-08-01", "2024-05-31"),
                        rng.choice((0, 0, 1, 1, 1, 2, 2, 3, 4)),
                        rng.choice((0, 0, 1, 1, 2, 2, 3)), maybe(rng, rng.randrange(4000, 60000, 50), 0.1)))
    stat_players = skewed_choices(rng, range(1, 141), 200)
    stats = [(i, pid, rng.randint(1, len(matches)), rng.choice((0, 0, 0, 0, 1, 1, 2, 3)),
              rng.choice((0, 0, 0, 1, 1, 2)),
              rng.choice((15, 30, 45, 60, 75, 90, 90, 90))) for i, pid in enumerate(stat_players, 1)]
    return {"teams": teams, "players": players, "matches": matches, "player_stats": stats}


PLAYER_TEAM = "FROM players AS T1 JOIN teams AS T2 ON T1.team_id = T2.team_id"
HOME = "FROM matches AS T1 JOIN teams AS T2 ON T1.home_team_id = T2.team_id"
PLAYER_STATS = "FROM players AS T1 JOIN player_stats AS T2 ON T1.player_id = T2.player_id"
POSITION = "SELECT DISTINCT position FROM players"
TEAM = "SELECT name AS team FROM teams"

TEMPLATES = (
    # single table
    T("players_position", "SELECT name FROM players WHERE position = '{position}' AND nationality = '{nat}'",
      "Which '{position}' players come from '{nat}'?",
      "List the names of players from '{nat}' who play as '{position}'.",
      slots="SELECT DISTINCT position, nationality AS nat FROM players"),
    T("count_nationality", "SELECT COUNT(*) FROM players WHERE nationality = '{nat}'",
      "How many players have the nationality '{nat}'?",
      "Count the players from '{nat}'.", slots="SELECT DISTINCT nationality AS nat FROM players"),
    T("free_agents", "SELECT name FROM players WHERE team_id IS NULL",
      "Which players do not belong to any team?",
      "List the free agents (players without a team)."),
    T("teams_founded_before", "SELECT name FROM teams WHERE founded_year < {year}",
      "Which teams were founded before {year}?",
      "List the teams with a founded year earlier than {year}.",
      slots="SELECT founded_year AS year FROM teams WHERE founded_year > 1900"),
    T("coach_of", "SELECT coach FROM teams WHERE name = '{team}'",
      "Who coaches '{team}'?", "What is the name of the coach of '{team}'?",
      slots="SELECT name AS team FROM teams WHERE coach IS NOT NULL"),
    T("no_coach_count", "SELECT COUNT(*) FROM teams WHERE coach IS NULL",
      "How many teams have no coach?", "Count the teams without a coach."),
    T("matches_on_date", "SELECT match_id FROM matches WHERE match_date = '{date}'",
      "Which matches were played on '{date}'? Give their ids.",
      "List the ids of matches on '{date}'.", slots="SELECT match_date AS date FROM matches"),
    T("high_scoring_home", "SELECT COUNT(*) FROM matches WHERE home_score >= {goals}",
      "In how many matches did the home team score at least {goals} goals?",
      "Count the matches with a home score of {goals} or "
      "more.", slots="SELECT DISTINCT home_score AS goals FROM matches"),
    T("avg_attendance", "SELECT AVG(attendance) FROM matches WHERE match_date LIKE '{month}%'",
      "What was the average attendance of matches in the month '{month}'?",
      "Find the mean attendance for matches played during '{month}'.",
      slots="SELECT DISTINCT substr(match_date, 1, 7) AS month FROM matches"),
    T("jersey_of", "SELECT jersey_number FROM players WHERE name = '{player}'",
      "What jersey number does '{player}' wear?",
      "Find the jersey number of the player '{player}'.", slots="SELECT name AS player FROM players"),
    T("draws_count", "SELECT COUNT(*) FROM matches WHERE home_score = away_score",
      "How many matches ended in a draw?", "Count the matches where both teams scored the same number of goals."),
    T("max_attendance", "SELECT MAX(attendance) FROM matches",
      "What was the highest attendance at a match?", "What is the largest crowd recorded for a match?"),
    # one join, GROUP BY or ORDER BY
    T("squad_of", f"SELECT T1.name {PLAYER_TEAM} WHERE T2.name = '{{team}}'",
      "Which players play for '{team}'?", "List the squad of '{team}'.", slots=TEAM),
    T("home_matches_of", f"SELECT T1.match_date, T1.home_score, T1.away_score {HOME} WHERE T2.name = '{{team}}'",
      "List the dates and scores of home matches of '{team}'.",
      "Show date, home score and away score for every home game of '{team}'.", slots=TEAM),
    T("players_per_position", "SELECT position, COUNT(*) FROM players GROUP BY position",
      "How many players are there in each position?", "Count the players per position."),
    T("oldest_team", "SELECT name FROM teams ORDER BY founded_year LIMIT 1",
      "Which team was founded first?", "What is the oldest team in the league?"),
    T("goals_of_player", f"SELECT SUM(T2.goals) {PLAYER_STATS} WHERE T1.name = '{{player}}'",
      "How many goals has '{player}' scored in total?",
      "What is the total number of goals by the player '{player}'?",
      slots=f"SELECT DISTINCT T1.name AS player {PLAYER_STATS}"),
    T("goals_per_nationality", f"SELECT T1.nationality, SUM(T2.goals) {PLAYER_STATS} GROUP BY T1.nationality",
      "How many goals have players of each nationality scored?",
      "For every nationality, sum the goals scored by its players."),
    T("biggest_crowds", "SELECT match_id, attendance FROM matches ORDER BY attendance DESC LIMIT 3",
      "Which three matches had the largest attendance?",
      "List the ids and attendance of the 3 best-attended matches."),
    T("team_nationalities", f"SELECT DISTINCT T1.nationality {PLAYER_TEAM} WHERE T2.name = '{{team}}'",
      "Which nationalities are represented in '{team}'?",
      "List the distinct nationalities of players on '{team}'.", slots=TEAM),
    T("youngest_in_position", "SELECT name FROM players WHERE position = '{position}' ORDER BY birth_date DESC LIMIT 1",
      "Who is the youngest '{position}'?",
      "Which '{position}' player was born most recently?", slots=POSITION),
    # nesting, set operations, HAVING, several joins
    T("top_scorer", f"SELECT T1.name {PLAYER_STATS} GROUP BY T1.player_id ORDER BY SUM(T2.goals) DESC LIMIT 1",
      "Who has scored the most goals?", "Which player is the league top scorer?"),
    T("no_stats_in_team",
      f"SELECT T1.name {PLAYER_TEAM} WHERE T2.name = '{{team}}' AND T1.player_id NOT IN (SELECT player_id FROM "
      "player_stats)",
      "Which players of '{team}' have no recorded match statistics?",
      "List the '{team}' players who never appear in the player stats.", slots=TEAM),
    T("scorers_for_team",
      f"SELECT DISTINCT T1.name {PLAYER_STATS} JOIN teams AS T3 ON T1.team_id = T3.team_id "
      "WHERE T3.name = '{team}' AND T2.goals > 0",
      "Which '{team}' players have scored at least one goal?",
      "List the distinct players of '{team}' with a goal in some match.", slots=TEAM),
    T("above_avg_attendance_home",
      f"SELECT T1.match_id {HOME} WHERE T2.name = '{{team}}' AND T1.attendance > (SELECT AVG(attendance) FROM matches)",
      "Which home matches of '{team}' drew more than the average attendance? Give match ids.",
      "List the ids of '{team}' home games whose attendance is above average.", slots=TEAM),
    T("positions_having", "SELECT position FROM players GROUP BY position HAVING COUNT(*) > {n}",
      "Which positions have more than {n} players?",
      "List the positions held by over {n} players.",
      slots="SELECT DISTINCT COUNT(*) - 1 AS n FROM players GROUP BY position"),
    T("two_positions_nat",
      "SELECT nationality FROM players WHERE position = '{pos1}' INTERSECT "
      "SELECT nationality FROM players WHERE position = '{pos2}'",
      "Which nationalities have players in both the '{pos1}' and the '{pos2}' positions?",
      "Find the nationalities with players in position '{pos1}' and also in position '{pos2}'.",
      slots="SELECT A.position AS pos1, B.position AS pos2 FROM (SELECT DISTINCT position FROM players) AS A "
            "JOIN (SELECT DISTINCT position FROM players) AS B ON A.position < B.position"),
    T("teams_without_big_home_score",
      "SELECT name FROM teams EXCEPT SELECT T2.name FROM matches AS T1 JOIN teams AS T2 ON T1.home_team_id = "
      "T2.team_id "
      "WHERE T1.home_score >= {goals}",
      "Which teams have never scored {goals} or more goals in a home match?",
      "List the teams without a home game in which they scored at least {goals} goals.",
      slots="SELECT DISTINCT home_score AS goals FROM matches WHERE home_score >= 2"),
    T("fixture", "SELECT T1.match_date FROM matches AS T1 JOIN teams AS T2 ON T1.home_team_id = T2.team_id "
      "JOIN teams AS T3 ON T1.away_team_id = T3.team_id WHERE T2.name = '{home}' AND T3.name = '{away}'",
      "When did '{home}' host '{away}'?",
      "On what date did '{home}' play at home against '{away}'?",
      slots="SELECT T2.name AS home, T3.name AS away FROM matches AS T1 JOIN teams AS T2 ON T1.home_team_id = "
            "T2.team_id "
            "JOIN teams AS T3 ON T1.away_team_id = T3.team_id"),
)

DOMAIN = Domain("sports_league", TABLES, populate, TEMPLATES)
