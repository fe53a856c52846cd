"""Hospital: doctors, patients, appointments and prescriptions."""

from __future__ import annotations

import random

from skyrl_tool_agent.data.builtin.names import CITIES, iso_date, maybe, person_names, skewed_choices
from skyrl_tool_agent.data.builtin.schema import Domain, Row, T, Table

SPECIALTIES = ("Cardiology", "Dermatology", "Neurology", "Pediatrics", "Oncology", "Orthopedics",
               "General Practice")
REASONS = ("Checkup", "Back pain", "Fever", "Skin rash", "Headache", "Follow-up", "Chest pain", "Allergy")
DRUGS = ("Ibuprofen", "Amoxicillin", "Lisinopril", "Metformin", "Cetirizine", "Omeprazole",
         "Atorvastatin", "Paracetamol")
FEES = (40.0, 60.0, 75.0, 90.0, 120.0, 150.0)
BLOOD_TYPES = ("A+", "A-", "B+", "B-", "O+", "O-", "AB+", "AB-")
STATUSES = ("Completed", "Completed", "Completed", "Cancelled", "Scheduled")

TABLES = (
    Table("doctors", (
        ("doctor_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("specialty", "TEXT"),
        ("years_experience", "INTEGER"), ("phone", "TEXT"),
    )),
    Table("patients", (
        ("patient_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("birth_date", "TEXT"),
        ("gender", "TEXT"), ("city", "TEXT"), ("blood_type", "TEXT"),
    )),
    Table("appointments", (
        ("appointment_id", "INTEGER PRIMARY KEY"), ("patient_id", "INTEGER NOT NULL"),
        ("doctor_id", "INTEGER NOT NULL"), ("appointment_date", "TEXT NOT NULL"), ("reason", "TEXT"),
        ("fee", "REAL"), ("status", "TEXT"),
    ), (("patient_id", "patients", "patient_id"), ("doctor_id", "doctors", "doctor_id"))),
    Table("prescriptions", (
        ("prescription_id", "INTEGER PRIMARY KEY"), ("appointment_id", "INTEGER NOT NULL"),
        ("drug_name", "TEXT"), ("dosage_mg", "INTEGER"), ("days", "INTEGER"),
    ), (("appointment_id", "appointments", "appointment_id"),)),
)


def populate(rng: random.Random) -> dict[str, list[Row]]:
    years = rng.sample(range(1, 41), 30)  # distinct, so "most experienced" has one answer
    doctors = [
        (i, f"Dr. {name}", rng.choice(SPECIALTIES), years[i - 1],
         maybe(rng, f"555-{rng.randint(1000, 9999)}", 0.25))
        for i, name in enumerate(person_names(rng, 30), 1)
    ]
    home_cities = skewed_choices(rng, range(10), 120)  # uneven, so one city has the most patients
    patients = [
        (i, name, iso_date(rng, "1940-01-01", "2015-12-31"), rng.choice("FM"), CITIES[home_cities[i - 1]][0],
         maybe(rng, rng.choice(BLOOD_TYPES), 0.2))
        for i, name in enumerate(person_names(rng, 120), 1)
    ]
    patient_ids = skewed_choices(rng, range(1, 121), 200)
    doctor_ids = skewed_choices(rng, range(1, 31), 200)
    appointments = [
        (i, patient_ids[i - 1], doctor_ids[i - 1], iso_date(rng, "2023-01-01", "2024-12-31"),
         rng.choice(REASONS), rng.choice(FEES), rng.choice(STATUSES))
        for i in range(1, 201)
    ]
    completed = [a[0] for a in appointments if a[6] == "Completed"]
    prescriptions = [
        (i, rng.choice(completed), rng.choice(DRUGS), rng.choice((5, 10, 20, 25, 50, 100, 250, 500)),
         rng.choice((3, 5, 7, 10, 14, 30)))
        for i in range(1, 151)
    ]
    return {"doctors": doctors, "patients": patients, "appointments": appointments,
            "prescriptions": prescriptions}


APPT_DOCTOR = "FROM appointments AS T1 JOIN doctors AS T2 ON T1.doctor_id = T2.doctor_id"
PATIENT_APPT = "FROM patients AS T1 JOIN appointments AS T2 ON T1.patient_id = T2.patient_id"
APPT_RX = "FROM appointments AS T1 JOIN prescriptions AS T2 ON T1.appointment_id = T2.appointment_id"
SPECIALTY = "SELECT DISTINCT specialty FROM doctors"
REASON = "SELECT DISTINCT reason FROM appointments"
DOCTOR_WITH_APPTS = f"SELECT DISTINCT T2.name AS doctor {APPT_DOCTOR}"

TEMPLATES = (
    # single table
    T("doctors_specialty", "SELECT name FROM doctors WHERE specialty = '{specialty}'",
      "Which doctors work in '{specialty}'?",
      "List the names of doctors whose specialty is '{specialty}'.",
      "Who are the '{specialty}' doctors?", slots=SPECIALTY),
    T("count_patients_city", "SELECT COUNT(*) FROM patients WHERE city = '{city}'",
      "How many patients live in '{city}'?",
      "Count the patients from the city '{city}'.", slots="SELECT DISTINCT city FROM patients"),
    T("patients_blood", "SELECT name FROM patients WHERE blood_type = '{blood}'",
      "Which patients have blood type '{blood}'?",
      "List the names of patients with the '{blood}' blood type.",
      slots="SELECT DISTINCT blood_type AS blood FROM patients"),
    T("count_status", "SELECT COUNT(*) FROM appointments WHERE status = '{status}'",
      "How many appointments have the status '{status}'?",
      "Count the '{status}' appointments.", slots="SELECT DISTINCT status FROM appointments"),
    T("avg_fee_reason", "SELECT AVG(fee) FROM appointments WHERE reason = '{reason}'",
      "What is the average fee of appointments for '{reason}'?",
      "Find the mean fee charged for '{reason}' appointments.", slots=REASON),
    T("doctors_experience_gt", "SELECT name FROM doctors WHERE years_experience > {years}",
      "Which doctors have more than {years} years of experience?",
      "List doctors with over {years} years of experience.",
      slots="SELECT years_experience AS years FROM doctors WHERE years_experience > 15"),
    T("patients_born_before", "SELECT name FROM patients WHERE birth_date < '{date}'",
      "Which patients were born before '{date}'?",
      "List the names of patients whose birth date is earlier than '{date}'.",
      slots="SELECT birth_date AS date FROM patients WHERE birth_date < '1965-01-01'"),
    T("doctors_no_phone", "SELECT name FROM doctors WHERE phone IS NULL",
      "Which doctors have no phone number on file?",
      "List the doctors whose phone is missing."),
    T("unknown_blood_count", "SELECT COUNT(*) FROM patients WHERE blood_type IS NULL",
      "How many patients have an unknown blood type?",
      "Count the patients with no recorded blood type."),
    T("specialty_of", "SELECT specialty FROM doctors WHERE name = '{doctor}'",
      "What is the specialty of '{doctor}'?",
      "Which specialty does '{doctor}' practice?", slots="SELECT name AS doctor FROM doctors"),
    T("max_dosage_drug", "SELECT MAX(dosage_mg) FROM prescriptions WHERE drug_name = '{drug}'",
      "What is the highest dosage in mg prescribed for '{drug}'?",
      "Find the maximum '{drug}' dosage in milligrams.",
      slots="SELECT DISTINCT drug_name AS drug FROM prescriptions"),
    T("total_fee_reason", "SELECT SUM(fee) FROM appointments WHERE reason = '{reason}'",
      "What is the total fee of all '{reason}' appointments?",
      "Add up the fees of appointments whose reason is '{reason}'.", slots=REASON),
    T("gender_city", "SELECT name FROM patients WHERE gender = '{gender}' AND city = '{city}'",
      "List the patients with gender '{gender}' who live in '{city}'.",
      "Which patients from '{city}' have the gender '{gender}'?",
      slots="SELECT DISTINCT gender, city FROM patients"),
    T("appts_on_date", "SELECT COUNT(*) FROM appointments WHERE appointment_date = '{date}'",
      "How many appointments were on '{date}'?",
      "Count the appointments scheduled for '{date}'.",
      slots="SELECT appointment_date AS date FROM appointments"),
    # one join, GROUP BY or ORDER BY
    T("count_appts_doctor", f"SELECT COUNT(*) {APPT_DOCTOR} WHERE T2.name = '{{doctor}}'",
      "How many appointments does '{doctor}' have?",
      "Count the appointments with the doctor '{doctor}'.", slots=DOCTOR_WITH_APPTS),
    T("doctors_per_specialty", "SELECT specialty, COUNT(*) FROM doctors GROUP BY specialty",
      "How many doctors are there in each specialty?",
      "For each specialty, count the doctors."),
    T("appts_per_status", "SELECT status, COUNT(*) FROM appointments GROUP BY status",
      "Show the number of appointments for each status.",
      "How many appointments are there per status?"),
    T("most_experienced", "SELECT name FROM doctors ORDER BY years_experience DESC LIMIT 1",
      "Which doctor has the most years of experience?",
      "Who is the most experienced doctor?"),
    T("reasons_of_patient", f"SELECT T2.reason {PATIENT_APPT} WHERE T1.name = '{{patient}}'",
      "What were the reasons for the appointments of '{patient}'?",
      "List the appointment reasons of the patient '{patient}'.",
      slots=f"SELECT DISTINCT T1.name AS patient {PATIENT_APPT}"),
    T("avg_fee_per_reason", "SELECT reason, AVG(fee) FROM appointments GROUP BY reason",
      "What is the average fee for each appointment reason?",
      "For every reason, show the average appointment fee."),
    T("drugs_for_reason", f"SELECT DISTINCT T2.drug_name {APPT_RX} WHERE T1.reason = '{{reason}}'",
      "Which drugs were prescribed at '{reason}' appointments?",
      "List the distinct drug names prescribed for the reason '{reason}'.",
      slots=f"SELECT DISTINCT T1.reason AS reason {APPT_RX}"),
    T("youngest_patients", "SELECT name FROM patients ORDER BY birth_date DESC LIMIT 5",
      "Who are the five youngest patients?",
      "List the names of the 5 most recently born patients."),
    T("prescriptions_per_drug", "SELECT drug_name, COUNT(*) FROM prescriptions GROUP BY drug_name",
      "How many prescriptions were written for each drug?",
      "Count the prescriptions per drug name."),
    T("fee_per_specialty", f"SELECT T2.specialty, SUM(T1.fee) {APPT_DOCTOR} GROUP BY T2.specialty",
      "What is the total appointment fee for each specialty?",
      "For each specialty, sum the fees of its appointments."),
    # nesting, set operations, HAVING, several joins
    T("patients_of_doctor",
      f"SELECT DISTINCT T1.name {PATIENT_APPT} JOIN doctors AS T3 ON T2.doctor_id = T3.doctor_id "
      "WHERE T3.name = '{doctor}'",
      "Which patients have had an appointment with '{doctor}'?",
      "List the distinct names of patients seen by '{doctor}'.", slots=DOCTOR_WITH_APPTS),
    T("doctor_most_appts", f"SELECT T2.name {APPT_DOCTOR} GROUP BY T1.doctor_id ORDER BY COUNT(*) DESC LIMIT 1",
      "Which doctor has the most appointments?",
      "Who is the doctor with the largest number of appointments?"),
    T("patients_without_appts",
      "SELECT name FROM patients WHERE city = '{city}' AND patient_id NOT IN (SELECT patient_id FROM appointments)",
      "Which patients from '{city}' have never had an appointment?",
      "List the patients living in '{city}' who have no appointments.",
      slots="SELECT DISTINCT city FROM patients"),
    T("fee_above_avg",
      "SELECT appointment_id FROM appointments WHERE reason = '{reason}' AND fee > (SELECT AVG(fee) FROM appointments)",
      "Which '{reason}' appointments cost more than the average appointment fee? Give their ids.",
      "List the ids of '{reason}' appointments whose fee is above the overall average fee.", slots=REASON),
    T("specialties_having", "SELECT specialty FROM doctors GROUP BY specialty HAVING COUNT(*) > {n}",
      "Which specialties have more than {n} doctors?",
      "List the specialties with over {n} doctors.",
      slots="SELECT DISTINCT COUNT(*) - 1 AS n FROM doctors GROUP BY specialty"),
    T("both_reasons",
      f"SELECT T1.name {PATIENT_APPT} WHERE T2.reason = '{{reason1}}' INTERSECT "
      f"SELECT T1.name {PATIENT_APPT} WHERE T2.reason = '{{reason2}}'",
      "Which patients had appointments for both '{reason1}' and '{reason2}'?",
      "Find patients who came in for '{reason1}' and also for '{reason2}'.",
      slots="SELECT A.reason AS reason1, B.reason AS reason2 FROM (SELECT DISTINCT reason FROM appointments) AS A "
            "JOIN (SELECT DISTINCT reason FROM appointments) AS B ON A.reason < B.reason"),
    T("doctors_without_status", f"SELECT name FROM doctors EXCEPT SELECT T2.name {APPT_DOCTOR} WHERE T1.status = "
                                f"'{{status}}'",
      "Which doctors have no '{status}' appointments?",
      "List the doctors who never had an appointment with status '{status}'.",
      slots="SELECT DISTINCT status FROM appointments"),
    T("drugs_by_doctor",
      "SELECT DISTINCT T3.drug_name FROM doctors AS T1 JOIN appointments AS T2 ON T1.doctor_id = T2.doctor_id "
      "JOIN prescriptions AS T3 ON T2.appointment_id = T3.appointment_id WHERE T1.name = '{doctor}'",
      "Which drugs has '{doctor}' prescribed?",
      "List the distinct drugs prescribed at appointments with '{doctor}'.",
      slots=f"SELECT DISTINCT T2.name AS doctor {APPT_DOCTOR} JOIN prescriptions AS T3 "
            "ON T1.appointment_id = T3.appointment_id"),
    T("city_most_patients", "SELECT city FROM patients GROUP BY city ORDER BY COUNT(*) DESC LIMIT 1",
      "Which city has the most patients?",
      "What is the most common city among patients?"),
)

DOMAIN = Domain("hospital", TABLES, populate, TEMPLATES)
