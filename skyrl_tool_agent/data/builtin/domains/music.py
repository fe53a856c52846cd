"""Music and concerts: artists, albums, venues and concerts."""

from __future__ import annotations

import random

from skyrl_tool_agent.data.builtin.names import (
    ADJECTIVES, CITIES, NOUNS, iso_date, maybe, plural, skewed_choices, titles,
)
from skyrl_tool_agent.data.builtin.schema import Domain, Row, T, Table

GENRES = ("Rock", "Jazz", "Hip-Hop", "Folk", "Electronic", "Pop", "Blues")
VENUE_KINDS = ("Arena", "Hall", "Club", "Theatre", "Stadium", "Garden")

TABLES = (
    Table("artists", (
        ("artist_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("genre", "TEXT"), ("country", "TEXT"),
        ("formed_year", "INTEGER"),
    )),
    Table("albums", (
        ("album_id", "INTEGER PRIMARY KEY"), ("artist_id", "INTEGER NOT NULL"), ("title", "TEXT NOT NULL"),
        ("release_year", "INTEGER"), ("rating", "REAL"),
    ), (("artist_id", "artists", "artist_id"),)),
    Table("venues", (
        ("venue_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("city", "TEXT"), ("capacity", "INTEGER"),
    )),
    Table("concerts", (
        ("concert_id", "INTEGER PRIMARY KEY"), ("artist_id", "INTEGER NOT NULL"), ("venue_id", "INTEGER NOT NULL"),
        ("concert_date", "TEXT"), ("tickets_sold", "INTEGER"), ("ticket_price", "REAL"),
    ), (("artist_id", "artists", "artist_id"), ("venue_id", "venues", "venue_id"))),
)


def populate(rng: random.Random) -> dict[str, list[Row]]:
    band_pool = [f"The {a} {plural(n)}" for a in ADJECTIVES for n in NOUNS]
    band_pool += [f"{n} {a}" for a in ADJECTIVES[:5] for n in NOUNS]
    formed = rng.sample(range(1965, 2021), 40)  # distinct, so "formed earliest" has one answer
    artists = [(i, name, rng.choice(GENRES), rng.choice(CITIES)[1], formed[i - 1])
               for i, name in enumerate(rng.sample(band_pool, 40), 1)]
    album_titles = titles(rng, 100, prefix_the=0.3)
    albums = []
    for i in range(1, 101):
        artist = rng.randint(1, 40)
        formed = artists[artist - 1][4]
        albums.append((i, artist, album_titles[i - 1], rng.randint(formed + 1, 2024),
                       maybe(rng, rng.choice((2.5, 3.0, 3.5, 3.5, 4.0, 4.0, 4.5, 5.0)), 0.15)))
    venue_names = rng.sample([f"{n} {k}" for n in NOUNS for k in VENUE_KINDS], 25)
    capacities = rng.sample(range(300, 60000, 100), 25)
    venues = [(i, name, rng.choice(CITIES[:12])[0], capacities[i - 1]) for i, name in enumerate(venue_names, 1)]
    concerts = []
    performers = skewed_choices(rng, range(1, 41), 150)
    for i in range(1, 151):
        venue = rng.randint(1, 25)
        concerts.append((i, performers[i - 1], venue, iso_date(rng, "2022-01-01", "2024-12-31"),
                         maybe(rng, rng.randint(venues[venue - 1][3] // 4, venues[venue - 1][3]), 0.1),
                         rng.choice((25.0, 35.0, 45.0, 60.0, 75.0, 90.0, 120.0))))
    return {"artists": artists, "albums": albums, "venues": venues, "concerts": concerts}


ALBUM_ARTIST = "FROM albums AS T1 JOIN artists AS T2 ON T1.artist_id = T2.artist_id"
CONCERT_ARTIST = "FROM concerts AS T1 JOIN artists AS T2 ON T1.artist_id = T2.artist_id"
CONCERT_VENUE = "FROM concerts AS T1 JOIN venues AS T2 ON T1.venue_id = T2.venue_id"
CONCERT_BOTH = CONCERT_ARTIST + " JOIN venues AS T3 ON T1.venue_id = T3.venue_id"
GENRE = "SELECT DISTINCT genre FROM artists"

TEMPLATES = (
    # single table
    T("artists_genre", "SELECT name FROM artists WHERE genre = '{genre}'",
      "Which artists play '{genre}'?",
      "List the names of '{genre}' artists.",
      "Who are the artists in the genre '{genre}'?", slots=GENRE),
    T("count_country", "SELECT COUNT(*) FROM artists WHERE country = '{country}'",
      "How many artists come from '{country}'?",
      "Count the artists whose country is '{country}'.", slots="SELECT DISTINCT country FROM artists"),
    T("albums_year", "SELECT title FROM albums WHERE release_year = {year}",
      "Which albums were released in {year}?",
      "List the titles of albums with release year {year}.", slots="SELECT DISTINCT release_year AS year FROM albums"),
    T("albums_rating", "SELECT title FROM albums WHERE rating >= {rating}",
      "Which albums have a rating of at least {rating}?",
      "List the albums rated {rating} or higher.", slots="SELECT DISTINCT rating FROM albums WHERE rating >= 4"),
    T("unrated_count", "SELECT COUNT(*) FROM albums WHERE rating IS NULL",
      "How many albums have no rating?",
      "Count the albums whose rating is missing."),
    T("venues_city", "SELECT name FROM venues WHERE city = '{city}'",
      "Which venues are in '{city}'?",
      "List the names of the venues located in '{city}'.", slots="SELECT DISTINCT city FROM venues"),
    T("big_venues", "SELECT name FROM venues WHERE capacity > {capacity}",
      "Which venues hold more than {capacity} people?",
      "List the venues with a capacity above {capacity}.",
      slots="SELECT capacity FROM venues WHERE capacity > 20000"),
    T("capacity_of", "SELECT capacity FROM venues WHERE name = '{venue}'",
      "What is the capacity of '{venue}'?",
      "How many people fit in the venue '{venue}'?", slots="SELECT name AS venue FROM venues"),
    T("formed_before", "SELECT name FROM artists WHERE formed_year < {year}",
      "Which artists were formed before {year}?",
      "List the artists whose formed year is earlier than {year}.",
      slots="SELECT formed_year AS year FROM artists WHERE formed_year < 1990"),
    T("concerts_on_date", "SELECT COUNT(*) FROM concerts WHERE concert_date = '{date}'",
      "How many concerts took place on '{date}'?",
      "Count the concerts held on '{date}'.", slots="SELECT concert_date AS date FROM concerts"),
    T("avg_ticket_price", "SELECT AVG(ticket_price) FROM concerts WHERE concert_date LIKE '{year}%'",
      "What was the average ticket price of concerts in the year '{year}'?",
      "Find the mean ticket price of concerts whose date begins with '{year}'.",
      slots="SELECT DISTINCT substr(concert_date, 1, 4) AS year FROM concerts"),
    T("unknown_sales", "SELECT concert_id FROM concerts WHERE tickets_sold IS NULL",
      "Which concerts have no ticket sales recorded? Give their ids.",
      "List the ids of concerts whose tickets sold value is missing."),
    T("genre_country", "SELECT name FROM artists WHERE genre = '{genre}' AND country = '{country}'",
      "Which '{genre}' artists are from '{country}'?",
      "List the artists from '{country}' who play '{genre}'.", slots="SELECT DISTINCT genre, country FROM artists"),
    # one join, GROUP BY or ORDER BY
    T("albums_of_artist", f"SELECT T1.title {ALBUM_ARTIST} WHERE T2.name = '{{artist}}'",
      "Which albums has '{artist}' released?",
      "List the album titles by '{artist}'.", slots=f"SELECT DISTINCT T2.name AS artist {ALBUM_ARTIST}"),
    T("concert_count_artist", f"SELECT COUNT(*) {CONCERT_ARTIST} WHERE T2.name = '{{artist}}'",
      "How many concerts has '{artist}' played?",
      "Count the concerts of the artist '{artist}'.", slots=f"SELECT DISTINCT T2.name AS artist {CONCERT_ARTIST}"),
    T("artists_per_genre", "SELECT genre, COUNT(*) FROM artists GROUP BY genre",
      "How many artists are there in each genre?",
      "Count the artists per genre."),
    T("largest_venue", "SELECT name FROM venues ORDER BY capacity DESC LIMIT 1",
      "Which venue has the largest capacity?",
      "What is the biggest venue?"),
    T("concerts_at_venue", f"SELECT T1.concert_date {CONCERT_VENUE} WHERE T2.name = '{{venue}}'",
      "On which dates were concerts held at '{venue}'?",
      "List the concert dates at the venue '{venue}'.", slots=f"SELECT DISTINCT T2.name AS venue {CONCERT_VENUE}"),
    T("tickets_per_city", f"SELECT T2.city, SUM(T1.tickets_sold) {CONCERT_VENUE} GROUP BY T2.city",
      "How many tickets were sold in each city?",
      "For every city, give the total number of tickets sold at its venues."),
    T("oldest_artists", "SELECT name, formed_year FROM artists ORDER BY formed_year LIMIT 3",
      "Which three artists were formed earliest, and when?",
      "List the 3 oldest artists with their formed year."),
    T("avg_rating_genre", f"SELECT AVG(T1.rating) {ALBUM_ARTIST} WHERE T2.genre = '{{genre}}'",
      "What is the average album rating of '{genre}' artists?",
      "Find the mean rating of albums by artists in the genre '{genre}'.", slots=GENRE),
    T("albums_per_year", "SELECT release_year, COUNT(*) FROM albums WHERE release_year >= {year} GROUP BY release_year",
      "How many albums were released in each year since {year}?",
      "For each release year from {year} on, count the albums.",
      slots="SELECT DISTINCT release_year AS year FROM albums WHERE release_year >= 2010"),
    # nesting, set operations, HAVING, several joins
    T("artists_in_city", f"SELECT DISTINCT T2.name {CONCERT_BOTH} WHERE T3.city = '{{city}}'",
      "Which artists have played a concert in '{city}'?",
      "List the distinct artists who performed at venues in '{city}'.",
      slots=f"SELECT DISTINCT T2.city AS city {CONCERT_VENUE}"),
    T("artists_no_albums", "SELECT name FROM artists WHERE artist_id NOT IN (SELECT artist_id FROM albums)",
      "Which artists have not released any album?",
      "List the artists without albums."),
    T("most_concerts", f"SELECT T2.name {CONCERT_ARTIST} GROUP BY T1.artist_id ORDER BY COUNT(*) DESC LIMIT 1",
      "Which artist has played the most concerts?",
      "Who performed the largest number of concerts?"),
    T("pricey_concerts", f"SELECT T1.concert_id {CONCERT_VENUE} WHERE T2.name = '{{venue}}' AND T1.ticket_price > "
      "(SELECT AVG(ticket_price) FROM concerts)",
      "Which concerts at '{venue}' had tickets priced above the average ticket price? Give their ids.",
      "List the ids of concerts held at '{venue}' with a ticket price above average.",
      slots=f"SELECT DISTINCT T2.name AS venue {CONCERT_VENUE}"),
    T("genres_having", "SELECT genre FROM artists GROUP BY genre HAVING COUNT(*) > {n}",
      "Which genres have more than {n} artists?",
      "List the genres with over {n} artists.", slots="SELECT DISTINCT COUNT(*) - 1 AS n FROM artists GROUP BY genre"),
    T("two_cities",
      f"SELECT T2.name {CONCERT_BOTH} WHERE T3.city = '{{city1}}' INTERSECT "
      f"SELECT T2.name {CONCERT_BOTH} WHERE T3.city = '{{city2}}'",
      "Which artists have performed in both '{city1}' and '{city2}'?",
      "Find the artists with a concert in '{city1}' and another in '{city2}'.",
      slots="SELECT A.city AS city1, B.city AS city2 FROM (SELECT DISTINCT city FROM venues) AS A "
            "JOIN (SELECT DISTINCT city FROM venues) AS B ON A.city < B.city"),
    T("venues_unused_by_genre",
      f"SELECT name FROM venues EXCEPT SELECT T3.name {CONCERT_BOTH} WHERE T2.genre = '{{genre}}'",
      "Which venues have never hosted an artist of the genre '{genre}'?",
      "List the venues with no concert by any '{genre}' artist.", slots=GENRE),
    T("latest_album_of", f"SELECT T1.title {ALBUM_ARTIST} WHERE T2.name = '{{artist}}' ORDER BY T1.release_year DESC "
                         "LIMIT 1",
      "What is the most recent album by '{artist}'?",
      "Which album did '{artist}' release last?", slots=f"SELECT DISTINCT T2.name AS artist {ALBUM_ARTIST}"),
)

DOMAIN = Domain("music_concerts", TABLES, populate, TEMPLATES)
